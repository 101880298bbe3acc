"""Process bookkeeping for local mode: which processes a worker needs and how each is started.

Pure: plans one worker of a deployment at any index (rollouts start workers beyond the spec's
count, so names and ports stay unique), turns a WorkerPlan into `ProcessSpec`s (argv, environment,
host GPUs) and answers questions about GPU capacity, ports and the checkpoint directory. The
supervisor does the I/O.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from omni_operator.api.spec import OmniDeployment, OmniDeploymentSpec, SourceType
from omni_operator.plan.layout import process_model_path
from omni_operator.plan.planner import plan_deployment
from omni_operator.plan.types import Plan, Target, WorkerPlan


@dataclass(frozen=True)
class ProcessSpec:
    name: str  # log prefix, e.g. tiny-omni-w0/worker
    worker: str | None  # None for the router
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LocalSettings:
    """Where a local deployment lives on this machine: the `omni up` flags the plan depends on."""

    base_port: int
    router_port: int
    gpu_offset: int
    workers_file: str


MAX_PORT = 65535


class LocalCapacityError(ValueError):
    """The plan needs what this machine lacks: GPUs, free ports, the checkpoint directory."""


def omni_argv(command: tuple[str, ...]) -> tuple[str, ...]:
    """Run `omni ...` with the interpreter that runs us, so local mode never picks a stray `omni`."""
    if command and command[0] == "omni":
        return (sys.executable, "-m", "omni_operator.cli", *command[1:])
    return command


def plan_local(dep: OmniDeployment, settings: LocalSettings) -> Plan:
    """The deployment's Plan for this machine; raises PlanError naming the field and the fix."""
    return plan_deployment(
        dep,
        target=Target.local,
        base_port=settings.base_port,
        router_port=settings.router_port,
        gpu_offset=settings.gpu_offset,
        workers_file=settings.workers_file,
    )


def plan_worker(dep: OmniDeployment, settings: LocalSettings, *, index: int) -> WorkerPlan:
    """Worker `index` of the deployment, also beyond spec.workers (a rollout's surge workers).

    The planner lays workers out by index ({name}-w{index}, ports base + 10 * index), and a
    worker's revision does not depend on the worker count, so planning index + 1 workers and
    taking the last gives the same worker the spec would have at that index.
    """
    spec = dep.spec.model_copy(update={"workers": index + 1})
    return plan_local(dep.model_copy(update={"spec": spec}), settings).workers[index]


def check_capacity(*, plan: Plan, available_gpus: int, gpu_offset: int = 0) -> None:
    needed = gpu_offset + plan.gpus_per_worker * len(plan.workers)
    if plan.gpus_per_worker and needed > available_gpus:
        per = f"{plan.gpus_per_worker} GPU{'s' if plan.gpus_per_worker != 1 else ''}"
        raise LocalCapacityError(
            f"spec.workers: {len(plan.workers)} workers x {per}"
            f"{f' after --gpu-offset {gpu_offset}' if gpu_offset else ''} need {needed} GPUs, "
            f"this machine has {available_gpus}; lower spec.workers, or use gpu.tier: cpu for a CPU run"
        )


def check_checkpoint(spec: OmniDeploymentSpec) -> None:
    """Refuse to start (instead of a crash loop) when the stage processes would find no checkpoint
    on this machine: a directory without config.json. (A pvc source never plans for this machine:
    rules.check_local.)"""
    source = spec.model.source
    if source.type is SourceType.tiny:
        return
    path = Path(process_model_path(spec, local=True))
    if (path / "config.json").is_file():
        return
    what = "has no config.json" if path.is_dir() else "is not a directory on this machine"
    if source.type is SourceType.host_path:
        raise LocalCapacityError(
            f"spec.model.source.hostPath: {path} {what}; point it at the checkpoint directory "
            "(omni up runs every stage on this machine)"
        )
    raise LocalCapacityError(
        f"spec.model.path: {path} {what}; with source type {source.type.value} omni up reads the "
        "checkpoint there on this machine: set spec.model.path to the checkpoint directory, or use "
        "source type hostPath with hostPath set to it"
    )


def host_gpus(*, available_gpus: int, gpu_offset: int) -> list[int]:
    """The host GPU ids local mode may hand out."""
    return list(range(gpu_offset, max(gpu_offset, available_gpus)))


def worker_processes(
    worker: WorkerPlan, *, gpus: tuple[int, ...] = (), base_env: dict[str, str] | None = None
) -> list[ProcessSpec]:
    """Every process of one worker, in start order (stage processes before the worker API).

    `gpus` are the host GPUs this worker holds, indexed by the plan's worker-level logical ids;
    each process sees only its own through CUDA_VISIBLE_DEVICES, and processes without GPUs get an
    empty value so they never grab a device by accident.
    """
    needed = max((g for pod in worker.pods for g in pod.logical_gpus), default=-1) + 1
    if len(gpus) < needed:
        raise LocalCapacityError(f"{worker.name} needs {needed} GPUs, {len(gpus)} given")
    env0 = dict(os.environ if base_env is None else base_env)
    specs: list[ProcessSpec] = []
    # Remote stages first so the API process finds its stage links listening.
    for pod in sorted(worker.pods, key=lambda p: p.role.value in {"api", "worker"}):
        visible = ",".join(str(gpus[g]) for g in pod.logical_gpus)
        env = {**env0, **pod.container.env, "CUDA_VISIBLE_DEVICES": visible}
        specs.append(
            ProcessSpec(
                name=f"{worker.name}/{pod.role.value}",
                worker=worker.name,
                argv=omni_argv(pod.container.command),
                env=env,
            )
        )
    return specs


def process_specs(*, plan: Plan, base_env: dict[str, str] | None = None) -> list[ProcessSpec]:
    """Every process of every worker of a plan, each worker on the GPUs the plan gave it."""
    specs: list[ProcessSpec] = []
    for worker in plan.workers:
        first = worker.index * plan.gpus_per_worker
        gpus = tuple(range(first, first + plan.gpus_per_worker))
        specs += worker_processes(worker, gpus=gpus, base_env=base_env)
    return specs


def router_spec(*, plan: Plan, base_env: dict[str, str] | None = None) -> ProcessSpec:
    env = {**dict(os.environ if base_env is None else base_env), **plan.router.container.env}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return ProcessSpec(name="router", worker=None, argv=omni_argv(plan.router.container.command), env=env)


def worker_ports(worker: WorkerPlan) -> list[int]:
    return sorted({port for pod in worker.pods for port in pod.container.ports.values()})


def busy_ports(ports: Iterable[int], *, host: str = "127.0.0.1") -> list[int]:
    """Ports another process already listens on (bound as the runtime binds: SO_REUSEADDR)."""
    busy: list[int] = []
    for port in ports:
        if not 0 < port <= MAX_PORT:  # no program listens there, and none of ours can either
            busy.append(port)
            continue
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError:
                busy.append(port)
    return busy


def check_port_range(*, plan: Plan) -> None:
    """Every worker port of the plan is a port (at most MAX_PORT) and not the router's."""
    for worker in plan.workers:
        ports = worker_ports(worker)
        if ports and ports[-1] > MAX_PORT:
            raise LocalCapacityError(
                f"--base-port: {worker.name} would listen on port {ports[-1]}, past {MAX_PORT}; lower "
                f"--base-port or spec.workers (worker i uses ports base+10*i+1 to base+10*i+4)"
            )
        if plan.router.port in ports:
            raise LocalCapacityError(
                f"--port {plan.router.port}: {worker.name} listens there too (worker i uses ports "
                f"base+10*i+1 to base+10*i+4); pick a --port outside them, or another --base-port"
            )


def check_ports(*, plan: Plan) -> None:
    """Refuse to start when the router's or a worker's port is taken (instead of a crash loop), past
    the last port, or the router's own."""
    busy = busy_ports([plan.router.port], host="0.0.0.0")
    if busy:
        raise LocalCapacityError(
            f"--port {plan.router.port}: another process listens there; pick a free --port"
        )
    check_port_range(plan=plan)
    for worker in plan.workers:
        busy = busy_ports(worker_ports(worker))
        if busy:
            raise LocalCapacityError(
                f"--base-port: port {busy[0]} of {worker.name} is in use; pick another --base-port "
                f"(worker i uses ports base+10*i+1 to base+10*i+4)"
            )
