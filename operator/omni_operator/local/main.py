"""`omni up`: run an OmniDeployment on this machine as local processes behind the router.

    omni up                      two workers of the tiny checkpoint (the embedded default)
    omni up -f dep.yaml          your deployment
    omni up -f dep.yaml          again, with an edited file, while the first runs: the running
                                 instance rolls its workers to the new spec (per spec.rollout)
                                 and this command follows the rollout until it completes

The running instance is found through its state dir (default ~/.cache/omni/up/<metadata.name>),
so a re-run with the same file, or the same --state-dir, reaches it. Every problem with the
input is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

from omni_operator.api.load import SpecError, load_deployments, parse_deployments
from omni_operator.local import control
from omni_operator.local.default import DEFAULT_DEPLOYMENT_YAML
from omni_operator.local.processes import (
    LocalCapacityError,
    LocalSettings,
    check_capacity,
    check_checkpoint,
    check_ports,
    plan_local,
)
from omni_operator.local.supervisor import Supervisor
from omni_operator.plan.types import PlanError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="omni up",
        description="Run an OmniDeployment on this machine: every stage of every worker plus the router. "
        "With no -f, two workers of the tiny random-weight checkpoint. Run it again with an edited "
        "file while it runs to roll the workers to the new spec.",
    )
    parser.add_argument(
        "-f", "--filename", help="OmniDeployment YAML (default: the embedded tiny deployment)"
    )
    parser.add_argument("--port", type=int, default=8000, help="router port (default 8000)")
    parser.add_argument(
        "--base-port",
        type=int,
        default=8100,
        help="worker i uses ports base+10*i+1 to base+10*i+4 (default 8100)",
    )
    parser.add_argument("--gpu-offset", type=int, default=0, help="first host GPU to use")
    parser.add_argument(
        "--state-dir",
        help="worker table and control socket (default ~/.cache/omni/up/<metadata.name>); "
        "a second omni up with the same state dir hands its spec to the running one",
    )
    parser.add_argument(
        "--no-follow",
        action="store_true",
        help="when handing a spec to a running omni up, return once it is accepted "
        "instead of following the rollout",
    )
    return parser


def count_gpus() -> int:
    """GPUs on this host as nvidia-smi sees them (0 without a driver)."""
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def _fail(message: str) -> int:
    print(f"omni up: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    for flag, value in (("--port", args.port), ("--base-port", args.base_port)):
        if not 1 <= value <= 65000:
            return _fail(f"{flag} {value}: expected a port between 1 and 65000")
    if args.gpu_offset < 0:
        return _fail(f"--gpu-offset {args.gpu_offset}: expected 0 or more")
    state_dir: Path | None = None
    try:
        if args.filename:
            file = args.filename
            if file == "-":
                text = sys.stdin.read()
                deployments = parse_deployments(text, file="<stdin>")
            else:
                deployments = load_deployments(file)  # file errors as one clear SpecError
                text = Path(file).read_text(encoding="utf-8")
        else:
            file, text = "<embedded default>", DEFAULT_DEPLOYMENT_YAML
            deployments = parse_deployments(text, file=file)
        if len(deployments) != 1:
            return _fail(f"{file}: holds {len(deployments)} OmniDeployments; give one per file")
        (dep,) = deployments
        state_dir = Path(args.state_dir or Path.home() / ".cache" / "omni" / "up" / dep.metadata.name)
        running = control.connect(state_dir)
        if running is not None:
            print(f"omni up: handing {file} to the omni up running for {state_dir}", flush=True)
            try:
                return control.hand_over(running, file=file, text=text, follow=not args.no_follow)
            except KeyboardInterrupt:
                print("omni up: stopped following; the rollout goes on", file=sys.stderr)
                return 130
        control.check_socket_path(state_dir)
        settings = LocalSettings(
            base_port=args.base_port,
            router_port=args.port,
            gpu_offset=args.gpu_offset,
            workers_file=str(state_dir / "workers.json"),
        )
        plan = plan_local(dep, settings)
        check_checkpoint(dep.spec)
        gpus = count_gpus()
        check_capacity(plan=plan, available_gpus=gpus, gpu_offset=args.gpu_offset)
        check_ports(plan=plan)
    except (SpecError, PlanError, LocalCapacityError, control.ControlError) as err:
        return _fail(str(err))
    except OSError as err:  # the state dir or the control socket
        return _fail(f"{err.filename or state_dir}: {err.strerror or err}")
    supervisor = Supervisor(dep=dep, settings=settings, state_dir=state_dir, available_gpus=gpus)
    try:
        return asyncio.run(supervisor.run())
    except (control.ControlError, OSError) as err:
        return _fail(str(err))
