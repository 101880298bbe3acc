"""The one `omni` command.

Each subcommand lives in its own module and is imported only when it runs, so the control plane
and the data plane never import each other through the CLI. A subcommand module exposes
``main(argv: list[str]) -> int`` and owns its argparse parser.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": (
        "omni_runtime.entrypoints.serve",
        "Run one worker: every stage of the pipeline behind the OpenAI API.",
    ),
    "stage": ("omni_runtime.entrypoints.stage", "Run some stages as their own process behind a stage link."),
    "router": ("omni_runtime.router.main", "Run the session router in front of workers."),
    "up": ("omni_operator.local.main", "Run an OmniDeployment on this machine as local processes."),
    "operator": ("omni_operator.main", "Run the Kubernetes operator."),
    "render": ("omni_operator.render.main", "Print the Kubernetes manifests of an OmniDeployment."),
    "plan": ("omni_operator.plan.main", "Print the placement plan of an OmniDeployment."),
    "crd": ("omni_operator.crdgen", "Write or print the generated CRD."),
    "bench": ("omni_runtime.bench.main", "Load-test a worker or router and plot the results."),
    "tiny-checkpoint": ("omni_runtime.entrypoints.tiny_checkpoint", "Write a tiny random-weight checkpoint."),
}


def _usage() -> str:
    lines = ["usage: omni <command> [options]", "", "commands:"]
    lines += [f"  {name:<16} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines.append("\nRun `omni <command> --help` for a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"omni: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    try:
        return int(module.main(rest) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
