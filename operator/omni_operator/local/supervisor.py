"""Local mode's I/O: run a deployment's workers and router as processes, publish the worker table,
follow each worker's /ready and the router's view, and carry out the rollout decisions.

Every tick (half a second) the supervisor probes each worker's /ready, asks the router which
workers are in rotation and how many live sessions each holds (GET /admin/workers), asks the pure
decision (rollout.py) what to do next and does it: start a worker, mark one `draining` in the
worker table (the router reads the file and sends it no new sessions), or stop a drained one
(out of the table first, then its processes). The first start is the same decision with no
workers yet, so starting, scaling and rolling share one code path.

The router reads the worker table from a JSON file this supervisor rewrites atomically; a worker
is `ready` there only while its API answers /ready, so a crashed stage takes its worker out of
rotation until it is back. A second `omni up -f` hands a new spec over the control socket
(control.py); `apply` plans it and the ticks roll the workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from omni_operator.api.load import SpecError, parse_deployments
from omni_operator.api.spec import OmniDeployment
from omni_operator.local import control
from omni_operator.local.processes import (
    MAX_PORT,
    LocalCapacityError,
    LocalSettings,
    busy_ports,
    check_capacity,
    check_checkpoint,
    check_port_range,
    host_gpus,
    plan_local,
    plan_worker,
    router_spec,
    worker_ports,
    worker_processes,
)
from omni_operator.local.rollout import Desired, Status, Step, next_step
from omni_operator.local.workers import LocalWorker, ManagedProcess
from omni_operator.plan.types import PlanError
from omni_operator.rollout import WorkerState

COLORS = ["\033[36m", "\033[35m", "\033[33m", "\033[32m", "\033[34m", "\033[91m"]
RESET = "\033[0m"
PORT_TRIES = 20  # worker indices skipped at most when another program holds a worker's ports


@dataclass
class RouterView:
    in_rotation: bool
    sessions: int
    revision: str


class Supervisor:
    def __init__(
        self,
        *,
        dep: OmniDeployment,
        settings: LocalSettings,
        state_dir: Path,
        available_gpus: int = 0,
        color: bool | None = None,
        tick: float = 0.5,
    ) -> None:
        self.settings = settings
        self.state_dir = state_dir
        self.workers_file = Path(settings.workers_file)
        self.available_gpus = available_gpus
        self.color = sys.stdout.isatty() if color is None else color
        self.tick = tick
        self.dep = dep
        self.plan = plan_local(dep, settings)
        self._workers: dict[str, LocalWorker] = {}
        self._next_index = 0
        self._next_color = 0
        self._free_gpus = host_gpus(available_gpus=available_gpus, gpu_offset=settings.gpu_offset)
        self._router = ManagedProcess(
            spec=router_spec(plan=self.plan), color=COLORS[-1], emit=self._emit, on_exit=self._on_exit
        )
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._last: tuple[Status, str] | None = None
        self._announced = False
        self._rolled_from: str | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        self._client: httpx.AsyncClient | None = None
        self._control: control.ControlServer | None = None

    # -- output -------------------------------------------------------------------------
    def _emit(self, prefix: str, color: str, line: str) -> None:
        if self.color and color:
            print(f"{color}{prefix:>22} |{RESET} {line}", flush=True)
        else:
            print(f"{prefix:>22} | {line}", flush=True)

    def say(self, line: str) -> None:
        self._emit("omni up", "", line)

    def progress(self, line: str) -> None:
        """A rollout step: printed here and sent to every follower."""
        self.say(line)
        if self._control is not None:
            self._control.progress(line)

    def _finish_followers(self, *, ok: bool, message: str) -> None:
        if self._control is not None:
            self._control.finish(ok=ok, message=message)

    # -- worker table ---------------------------------------------------------------------
    def write_table(self, *, gone: bool = False) -> None:
        rows = [w.row() for w in sorted(self._workers.values(), key=lambda w: w.plan.index) if not w.retiring]
        if gone:
            for row in rows:
                row["state"] = "gone"
        tmp = self.workers_file.with_name(self.workers_file.name + ".tmp")
        tmp.write_text(json.dumps({"workers": rows}, indent=2))
        os.replace(tmp, self.workers_file)  # atomic: the router never reads half a file

    def _set_phase(self, worker: LocalWorker, phase: WorkerState) -> None:
        if worker.phase is WorkerState.draining or worker.phase is phase:
            return
        self.say(f"worker {worker.name}: {worker.phase.value} -> {phase.value}")
        worker.phase = phase
        if phase is not WorkerState.ready:
            worker.admitted = False
        self.write_table()

    def _on_exit(self, process: ManagedProcess, code: int) -> None:
        worker = self._workers.get(process.spec.worker or "")
        if worker is not None and not worker.retiring:
            self._set_phase(worker, WorkerState.starting)

    # -- applying a spec -----------------------------------------------------------------
    def desired(self) -> Desired:
        per_worker = self.plan.gpus_per_worker
        capacity = None if per_worker == 0 else len(self._workers) + len(self._free_gpus) // per_worker
        return Desired.of(
            revision=self.plan.revision,
            workers=self.dep.spec.workers,
            rollout=self.dep.spec.rollout,
            capacity=capacity,
        )

    def apply(self, *, text: str, file: str) -> str:
        """Take a new spec from a second `omni up -f`; raises SpecError/PlanError/LocalCapacityError."""
        deployments = parse_deployments(text, file=file)
        if len(deployments) != 1:
            raise LocalCapacityError(f"{file}: holds {len(deployments)} OmniDeployments; give one per file")
        (dep,) = deployments
        if dep.metadata.name != self.dep.metadata.name:
            raise LocalCapacityError(
                f"{file}: metadata.name: {dep.metadata.name!r}, but this omni up runs "
                f"{self.dep.metadata.name!r}; keep the name, or run the new deployment with its own --state-dir"
            )
        plan = plan_local(dep, self.settings)
        check_checkpoint(dep.spec)
        check_capacity(plan=plan, available_gpus=self.available_gpus, gpu_offset=self.settings.gpu_offset)
        check_port_range(plan=plan)
        old_dep, old_plan = self.dep, self.plan
        self.dep, self.plan = dep, plan
        self._finish_followers(ok=True, message="a newer spec was applied; stopped following")
        self._last = None
        rollout = dep.spec.rollout
        parts: list[str] = []
        if plan.revision != old_plan.revision:
            self._rolled_from = old_plan.revision
            parts.append(
                f"rolling workers from revision {old_plan.revision} to {plan.revision}: "
                f"{dep.spec.workers} workers, maxSurge {rollout.max_surge}, maxUnavailable {rollout.max_unavailable}"
            )
        elif dep.spec.workers != old_dep.spec.workers:
            parts.append(f"scaling from {old_dep.spec.workers} to {dep.spec.workers} workers")
        else:
            parts.append(f"no change to the workers (revision {plan.revision}, {dep.spec.workers} workers)")
        if rollout != old_dep.spec.rollout:
            parts.append("rollout settings updated" + (" (paused)" if rollout.paused else ""))
        if plan.router != old_plan.router:
            parts.append("spec.router changed: the router keeps its settings until omni up restarts")
        message = "; ".join(parts)
        self.progress(message)
        self._wake.set()
        return message

    # -- workers ------------------------------------------------------------------------
    async def _start_worker(self) -> None:
        for _ in range(PORT_TRIES):
            index = self._next_index
            self._next_index += 1
            plan = plan_worker(self.dep, self.settings, index=index)
            busy = busy_ports(worker_ports(plan))
            if not busy:
                break
            if busy[-1] > MAX_PORT:
                self.progress(
                    f"{plan.name} would listen on port {busy[-1]}, past {MAX_PORT}; restart omni up with "
                    "a lower --base-port"
                )
                return
            self.say(
                f"port {busy[0]} of {plan.name} is in use by another program; skipping to the next index"
            )
        else:
            self.progress(f"no free ports for a new worker after {PORT_TRIES} tries; free some ports")
            return
        gpus = tuple(self._free_gpus[: self.plan.gpus_per_worker])
        self._free_gpus = self._free_gpus[len(gpus) :]
        processes = []
        for spec in worker_processes(plan, gpus=gpus):
            color = COLORS[self._next_color % (len(COLORS) - 1)]
            self._next_color += 1
            processes.append(ManagedProcess(spec=spec, color=color, emit=self._emit, on_exit=self._on_exit))
        worker = LocalWorker(plan=plan, processes=processes, gpus=gpus)
        self._workers[worker.name] = worker
        self.write_table()
        where = f", GPUs {','.join(map(str, gpus))}" if gpus else ""
        self.progress(f"start {worker.name} (revision {plan.revision}, {plan.api_url}{where})")
        for process in processes:
            await process.start()

    async def _retire(self, worker: LocalWorker, reason: str) -> None:
        """Stop a drained worker: out of the table, gone from the router, then its processes."""
        self.progress(f"stop {worker.name} ({reason})")
        self.write_table()  # `retiring` leaves it out of the table
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and await self._router_knows(worker.name):
            await asyncio.sleep(0.1)
        for process in worker.processes:
            process.begin_stop()
        for process in worker.processes:
            await process.wait_stopped(grace=10.0)
        self._free_gpus = sorted([*self._free_gpus, *worker.gpus])
        self._workers.pop(worker.name, None)
        self.say(f"stopped {worker.name}")
        self._wake.set()

    # -- observing ------------------------------------------------------------------------
    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.plan.router.port}"

    async def _router_knows(self, worker_id: str) -> bool:
        assert self._client is not None
        try:
            response = await self._client.get(f"{self.router_url}/admin/workers/{worker_id}")
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def _router_view(self) -> dict[str, RouterView] | None:
        assert self._client is not None
        try:
            response = await self._client.get(f"{self.router_url}/admin/workers", timeout=2.0)
            entries = response.json()["workers"] if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None
        if not isinstance(entries, list):
            return None
        return {
            str(e["id"]): RouterView(bool(e["in_rotation"]), int(e["sessions"]), str(e["revision"]))
            for e in entries
        }

    async def _probe(self, worker: LocalWorker) -> None:
        assert self._client is not None
        try:
            response = await self._client.get(worker.ready_url)
        except httpx.TimeoutException:
            return  # busy, not dead: the router's own checks decide rotation meanwhile
        except httpx.HTTPError:
            self._set_phase(worker, WorkerState.starting)
            return
        self._set_phase(worker, WorkerState.ready if response.status_code == 200 else WorkerState.starting)

    async def _observe(self) -> None:
        live = [w for w in self._workers.values() if not w.retiring]
        await asyncio.gather(*(self._probe(w) for w in live))
        routed = await self._router_view()
        for worker in live:
            seen = routed.get(worker.name) if routed is not None else None
            worker.sessions = seen.sessions if seen is not None else None
            worker.admitted = (
                worker.phase is WorkerState.ready
                and seen is not None
                and seen.in_rotation
                and seen.revision == worker.revision
            )
            worker.ever_admitted = worker.ever_admitted or worker.admitted

    # -- deciding and acting ----------------------------------------------------------------
    async def _act(self, step: Step, now: float) -> None:
        for stop in step.stop:
            worker = self._workers.get(stop.name)
            if worker is None or worker.retiring:
                continue
            worker.retiring = True
            task = asyncio.create_task(self._retire(worker, stop.reason), name=f"retire {stop.name}")
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        for name in step.drain:
            worker = self._workers[name]
            sessions = "unknown" if worker.sessions is None else worker.sessions
            worker.phase, worker.admitted, worker.draining_since = WorkerState.draining, False, now
            self.write_table()
            self.progress(f"drain {name} (revision {worker.revision}, {sessions} live sessions)")
        for _ in range(step.start):
            await self._start_worker()

    def _report(self, step: Step) -> None:
        """Log the state a step starts from (before its actions) and end followers on a final one."""
        if (step.status, step.message) == self._last:
            return
        self._last = (step.status, step.message)
        if not step.status.final:
            self.progress(f"rollout: {step.message}")
            return
        line = f"rollout {step.status.value.replace('_', ' ')}: {step.message}"
        if step.status is Status.complete and self._rolled_from is not None:
            line = f"rollout complete: revision {self._rolled_from} -> {self.plan.revision}: {step.message}"
            self._rolled_from = None
        self.say(line)
        self._finish_followers(ok=step.status in (Status.complete, Status.paused), message=line)
        if step.status is Status.complete and not self._announced:
            self._announced = True
            self._announce()

    def _announce(self) -> None:
        url = self.router_url
        body = json.dumps(
            {
                "model": self.plan.model_name,
                "messages": [{"role": "user", "content": "Hello!"}],
                "max_tokens": 32,
            }
        )
        self.say(
            f"ready: {self.dep.spec.workers} worker{'s' if self.dep.spec.workers != 1 else ''} of {self.plan.model_name!r} behind the router at {url}"
        )
        self.say(f"try:  curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'")
        self.say("press Ctrl-C to stop; edit the spec and run `omni up -f FILE` again to roll the workers")

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            await self._observe()
            if self._stopping.is_set():
                return
            now = time.monotonic()
            step = next_step([w.view() for w in self._workers.values()], self.desired(), now=now)
            self._report(step)
            await self._act(step, now)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.tick)

    # -- life cycle -----------------------------------------------------------------------
    async def run(self) -> int:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.workers_file.parent.mkdir(parents=True, exist_ok=True)
        self._control = control.ControlServer(
            apply=self.apply, refused=(SpecError, PlanError, LocalCapacityError)
        )
        await self._control.listen(self.state_dir)
        self.write_table()
        started = time.monotonic()
        self.say(
            f"starting {self.dep.spec.workers} workers of revision {self.plan.revision} and the router "
            f"for {self.plan.deployment!r}; worker table {self.workers_file}, pid {os.getpid()}"
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stopping.set)
        async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
            self._client = client
            await self._router.start()
            ticking = asyncio.create_task(self._loop(), name="ticks")
            stopping = asyncio.create_task(self._stopping.wait())
            await asyncio.wait({ticking, stopping}, return_when=asyncio.FIRST_COMPLETED)
            # The tick loop only ends by itself on a bug: stop everything rather than run unsupervised.
            failure = ticking.exception() if ticking.done() else None
            self._stopping.set()
            self._wake.set()
            if failure is not None:
                self.say(f"internal error, stopping: {type(failure).__name__}: {failure}")
            self.say(f"stopping after {time.monotonic() - started:.0f}s")
            self._control.close()
            self._finish_followers(ok=False, message="omni up stopped")
            await asyncio.gather(ticking, stopping, return_exceptions=True)
            await self._stop_all()
        self._control.remove()
        self.write_table(gone=True)
        self.say("stopped")
        return 1 if failure is not None else 0

    def request_stop(self) -> None:
        self._stopping.set()

    async def _stop_all(self, grace: float = 10.0) -> None:
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        # Router first (no new sessions), then every worker process; all stop concurrently.
        everything = [self._router, *(p for w in self._workers.values() for p in w.processes)]
        for process in everything:
            process.begin_stop()
        await asyncio.gather(*(p.wait_stopped(grace=grace) for p in everything))
