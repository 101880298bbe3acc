"""Local mode's I/O: start a Plan's processes, prefix their logs, publish the worker table, restart
crashed processes, and stop everything cleanly.

The router reads the worker table from a JSON file this supervisor rewrites atomically; a worker
is `ready` there only while its API answers /ready, so a crashed stage takes its worker out of
rotation until it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from omni_operator.local.processes import ProcessSpec
from omni_operator.plan.types import Plan

COLORS = ["\033[36m", "\033[35m", "\033[33m", "\033[32m", "\033[34m", "\033[91m"]
RESET = "\033[0m"


@dataclass
class Managed:
    spec: ProcessSpec
    color: str
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0
    pump: asyncio.Task[None] | None = None


@dataclass
class WorkerRow:
    id: str
    url: str
    revision: str
    state: str = "starting"


@dataclass
class Supervisor:
    plan: Plan
    workers_file: Path
    processes: list[ProcessSpec]
    router: ProcessSpec
    color: bool = field(default_factory=lambda: sys.stdout.isatty())
    health_interval: float = 0.5
    max_backoff: float = 30.0

    def __post_init__(self) -> None:
        self._managed = [
            Managed(spec=spec, color=COLORS[i % len(COLORS)])
            for i, spec in enumerate([*self.processes, self.router])
        ]
        self._rows = {
            w.name: WorkerRow(id=w.name, url=w.api_url, revision=w.revision) for w in self.plan.workers
        }
        self._stopping = asyncio.Event()
        self._announced = False

    # -- output -------------------------------------------------------------------------
    def say(self, line: str, *, prefix: str = "omni up", color: str = "") -> None:
        if self.color and color:
            print(f"{color}{prefix:>22} |{RESET} {line}", flush=True)
        else:
            print(f"{prefix:>22} | {line}", flush=True)

    async def _pump(self, managed: Managed) -> None:
        assert managed.proc is not None and managed.proc.stdout is not None
        async for raw in managed.proc.stdout:
            self.say(raw.decode(errors="replace").rstrip(), prefix=managed.spec.name, color=managed.color)

    # -- worker table ---------------------------------------------------------------------
    def write_table(self) -> None:
        payload = {"workers": [vars(row) for row in self._rows.values()]}
        tmp = self.workers_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload, indent=2))
        os.replace(tmp, self.workers_file)  # atomic: the router never reads half a file

    def _set_state(self, worker: str, state: str) -> None:
        row = self._rows[worker]
        if row.state != state:
            self.say(f"worker {worker}: {row.state} -> {state}")
            row.state = state
            self.write_table()

    # -- processes ----------------------------------------------------------------------
    async def _start(self, managed: Managed) -> None:
        managed.proc = await asyncio.create_subprocess_exec(
            *managed.spec.argv,
            env=managed.spec.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # our Ctrl-C handling stops children in order
        )
        managed.pump = asyncio.create_task(self._pump(managed))

    async def _watch(self, managed: Managed) -> None:
        """Restart a process that exits while we are not stopping, with exponential backoff."""
        while not self._stopping.is_set():
            assert managed.proc is not None
            code = await managed.proc.wait()
            if managed.pump:
                await managed.pump
            if self._stopping.is_set():
                return
            managed.restarts += 1
            delay = min(self.max_backoff, 2.0 ** min(managed.restarts - 1, 5))
            self.say(
                f"{managed.spec.name} exited with code {code}; restart #{managed.restarts} in {delay:.0f}s"
            )
            if managed.spec.worker:
                self._set_state(managed.spec.worker, "starting")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=delay)
            if self._stopping.is_set():
                return
            await self._start(managed)

    async def _health(self) -> None:
        async with httpx.AsyncClient(timeout=2.0) as client:
            while not self._stopping.is_set():
                for row in self._rows.values():
                    try:
                        ok = (await client.get(f"{row.url}/ready")).status_code == 200
                    except httpx.HTTPError:
                        ok = False
                    if row.state != "draining":
                        self._set_state(row.id, "ready" if ok else "starting")
                if not self._announced:
                    await self._announce(client)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=self.health_interval)

    async def _announce(self, client: httpx.AsyncClient) -> None:
        url = f"http://127.0.0.1:{self.plan.router.port}"
        ready = [row for row in self._rows.values() if row.state == "ready"]
        if len(ready) < len(self._rows):
            return
        try:
            if (await client.get(f"{url}/ready")).status_code != 200:
                return
        except httpx.HTTPError:
            return
        self._announced = True
        body = json.dumps(
            {"model": self.plan.model_name, "messages": [{"role": "user", "content": "Hello!"}]}
        )
        self.say(f"ready: {len(ready)} workers of {self.plan.model_name!r} behind the router at {url}")
        self.say(f"try:  curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'")
        self.say("press Ctrl-C to stop")

    async def run(self) -> int:
        self.workers_file.parent.mkdir(parents=True, exist_ok=True)
        self.write_table()
        started = time.monotonic()
        self.say(
            f"starting {len(self.plan.workers)} workers ({len(self.processes)} processes) and the router "
            f"for {self.plan.deployment!r}; worker table {self.workers_file}"
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stopping.set)
        for managed in self._managed:
            await self._start(managed)
        watchers = [asyncio.create_task(self._watch(m)) for m in self._managed]
        health = asyncio.create_task(self._health())
        await self._stopping.wait()
        self.say(f"stopping after {time.monotonic() - started:.0f}s")
        await self._stop_all()
        for task in [*watchers, health]:
            task.cancel()
        await asyncio.gather(*watchers, health, return_exceptions=True)
        for row in self._rows.values():
            row.state = "gone"
        self.write_table()
        self.say("stopped")
        return 0

    def request_stop(self) -> None:
        self._stopping.set()

    async def _stop_all(self, grace: float = 10.0) -> None:
        # Router first (no new sessions), then workers.
        for managed in reversed(self._managed):
            if managed.proc and managed.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    managed.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for managed in self._managed:
            if managed.proc is None:
                continue
            try:
                await asyncio.wait_for(managed.proc.wait(), timeout=max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                self.say(f"{managed.spec.name} did not stop in {grace:.0f}s; killing it")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(managed.proc.pid, signal.SIGKILL)
                await managed.proc.wait()
