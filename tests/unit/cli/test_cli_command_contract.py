"""The command lines the planner emits are accepted by the runtime's own parsers.

The planner and the runtime meet only at command lines; this keeps both sides of that contract in
step. Every program the planner names must have a parser: a missing one fails.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

import pytest

from omni_operator.api.load import load_deployments
from omni_operator.api.spec import OmniDeployment
from omni_operator.plan.planner import plan_deployment
from omni_operator.plan.types import Target

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
BUILTIN = [
    "tiny-cpu.yaml",
    "tiny-qwen3-cpu.yaml",
    "qwen2.5-omni-7b-h100.yaml",
    "qwen3-omni-builtin-h200.yaml",
    "minicpm-o-duplex.yaml",
]


def _parser(module: str):
    return importlib.import_module(module).build_parser()


def _commands(
    program: str, local: Callable[[OmniDeployment], OmniDeployment]
) -> list[tuple[str, tuple[str, ...]]]:
    found = []
    for name in BUILTIN:
        (dep,) = load_deployments(EXAMPLES / name)
        for target in Target:
            plan = plan_deployment(local(dep) if target is Target.local else dep, target=target)
            for worker in plan.workers:
                for pod in worker.pods:
                    if pod.container.command[:2] == ("omni", program):
                        found.append((f"{name}/{target.value}/{pod.name}", pod.container.command[2:]))
            if plan.router.container.command[:2] == ("omni", program):
                found.append((f"{name}/{target.value}/router", plan.router.container.command[2:]))
    return found


@pytest.mark.parametrize(
    ("program", "module"),
    [
        ("serve", "omni_runtime.entrypoints.serve"),
        ("stage", "omni_runtime.entrypoints.stage"),
        ("router", "omni_runtime.router.main"),
    ],
)
def test_runtime_parsers_accept_planned_commands(
    program: str, module: str, local_checkpoint: Callable[[OmniDeployment], OmniDeployment]
) -> None:
    parser = _parser(module)
    commands = _commands(program, local_checkpoint)
    assert commands, f"no planned `omni {program}` command to check"
    for where, argv in commands:
        try:
            parser.parse_args(list(argv))
        except SystemExit as exc:  # argparse exits on unknown or malformed flags
            pytest.fail(f"{where}: `omni {program}` rejected {' '.join(argv)} (exit {exc.code})")
