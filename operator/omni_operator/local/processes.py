"""Process bookkeeping for local mode: which processes a Plan needs and how each is started.

Pure: turns a Plan into `ProcessSpec`s (argv, environment, GPU mapping) and answers questions
about GPU capacity. The supervisor does the I/O.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from omni_operator.plan.types import Plan


@dataclass(frozen=True)
class ProcessSpec:
    name: str  # log prefix, e.g. tiny-omni-w0/worker
    worker: str | None  # None for the router
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


class LocalCapacityError(ValueError):
    """The plan needs more GPUs than this machine has."""


def omni_argv(command: tuple[str, ...]) -> tuple[str, ...]:
    """Run `omni ...` with the interpreter that runs us, so local mode never picks a stray `omni`."""
    if command and command[0] == "omni":
        return (sys.executable, "-m", "omni_operator.cli", *command[1:])
    return command


def check_capacity(*, plan: Plan, available_gpus: int, gpu_offset: int = 0) -> None:
    needed = gpu_offset + plan.gpus_per_worker * len(plan.workers)
    if plan.gpus_per_worker and needed > available_gpus:
        raise LocalCapacityError(
            f"spec.workers: {len(plan.workers)} workers x {plan.gpus_per_worker} GPUs need {needed} GPUs, "
            f"this machine has {available_gpus}; lower spec.workers, or use gpu.tier: cpu for a CPU run"
        )


def process_specs(*, plan: Plan, base_env: dict[str, str] | None = None) -> list[ProcessSpec]:
    """Every process of every worker, in start order (stage processes before the worker API).

    A local Plan already carries each process's CUDA_VISIBLE_DEVICES (host GPU ids); processes
    without GPUs get an empty value so they never grab a device by accident.
    """
    env0 = dict(os.environ if base_env is None else base_env)
    specs: list[ProcessSpec] = []
    for worker in plan.workers:
        # Remote stages first so the API process finds its stage links listening.
        for pod in sorted(worker.pods, key=lambda p: p.role.value in {"api", "worker"}):
            env = {**env0, "CUDA_VISIBLE_DEVICES": "", **pod.container.env}
            specs.append(
                ProcessSpec(
                    name=f"{worker.name}/{pod.role.value}",
                    worker=worker.name,
                    argv=omni_argv(pod.container.command),
                    env=env,
                )
            )
    return specs


def router_spec(*, plan: Plan, base_env: dict[str, str] | None = None) -> ProcessSpec:
    env = {**dict(os.environ if base_env is None else base_env), **plan.router.container.env}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return ProcessSpec(name="router", worker=None, argv=omni_argv(plan.router.container.command), env=env)
