"""Local processes and workers: start a process with prefixed logs, restart it when it crashes, stop
it (and everything it started) on request.

A `ManagedProcess` owns one OS process and its restarts; a `LocalWorker` groups the processes of
one worker with what the supervisor tracks about it (phase, admission, drain start, GPUs). The
supervisor decides; these classes only do what they are told.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from omni_operator.local.processes import ProcessSpec
from omni_operator.plan.types import WorkerPlan
from omni_operator.rollout import WorkerState, WorkerView

Emit = Callable[[str, str, str], None]  # (prefix, color, line)
OnExit = Callable[["ManagedProcess", int], None]

# A process that ran this long before crashing starts its backoff from the beginning again.
STABLE_AFTER_S = 60.0
READ_CHUNK = 64 * 1024  # bytes read from a child's output at a time; lines may be any length
MAX_LINE_BYTES = 8 * 1024  # a longer output line is shown cut, with how much was left out
STOP_GRACE_S = 10.0


class LineSplitter:
    """Splits a child's output into display lines, whatever their length.

    `StreamReader`'s own line reading fails on a line over its 64 KiB limit, and a reader that
    stops reading leaves the child blocked on a full pipe. This keeps the first `limit` bytes of
    each line and counts the rest, so memory stays bounded and every line is shown.
    """

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        self.limit = limit
        self._kept = bytearray()
        self._dropped = 0

    def feed(self, chunk: bytes) -> list[str]:
        lines: list[str] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            room = max(0, self.limit - len(self._kept))
            self._kept += piece[:room]
            self._dropped += max(0, len(piece) - room)
            if end < 0:
                return lines
            lines.append(self._line())
            start = end + 1

    def close(self) -> list[str]:
        """The last line, when the output ended without a newline."""
        return [self._line()] if self._kept or self._dropped else []

    def _line(self) -> str:
        text = self._kept.decode(errors="replace").rstrip()
        if self._dropped:
            text += f" ...[{self._dropped} more bytes]"
        self._kept, self._dropped = bytearray(), 0
        return text


@dataclass
class ManagedProcess:
    spec: ProcessSpec
    color: str
    emit: Emit
    on_exit: OnExit
    max_backoff: float = 30.0
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0
    stopping: bool = False
    _task: asyncio.Task[None] | None = None
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.returncode is None else None

    async def _spawn(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.spec.argv,
            env=self.spec.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            # Its own process group: Ctrl-C reaches only `omni up`, which stops children in order,
            # and a stop signals the whole group (anything the process started goes too).
            start_new_session=True,
        )

    async def _pump(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        lines = LineSplitter()
        while chunk := await proc.stdout.read(READ_CHUNK):
            for line in lines.feed(chunk):
                self.emit(self.spec.name, self.color, line)
        for line in lines.close():
            self.emit(self.spec.name, self.color, line)

    async def start(self) -> None:
        """Start the process now and keep it running (restarts with backoff) until `stop`."""
        await self._spawn()
        self._task = asyncio.create_task(self._supervise(), name=f"watch {self.spec.name}")

    async def _wait_and_read(self, proc: asyncio.subprocess.Process) -> int:
        """Wait for the process to exit while its output is read. When the reading fails, nobody
        would drain the pipe and the process would block on its next write: say so and stop it
        (SIGTERM, then SIGKILL), so it restarts like a crashed process."""
        pump = asyncio.create_task(self._pump(proc), name=f"read {self.spec.name}")
        exited = asyncio.create_task(proc.wait(), name=f"wait {self.spec.name}")
        await asyncio.wait({pump, exited}, return_when=asyncio.FIRST_COMPLETED)
        failure = pump.exception() if pump.done() and not pump.cancelled() else None
        drain: asyncio.Task[None] | None = None
        if failure is not None:
            # Keep the pipe flowing (output discarded): a full, unread pipe blocks the process, and
            # asyncio sees it exit only once its pipe reaches end of file.
            drain = asyncio.create_task(self._discard(proc), name=f"drain {self.spec.name}")
            with contextlib.suppress(Exception):  # the failure may be in our own output
                self.emit(
                    "omni up",
                    "",
                    f"error: reading the output of {self.spec.name} failed "
                    f"({type(failure).__name__}: {failure}); stopping it so it restarts",
                )
        if failure is not None and not exited.done():
            self.signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(exited), timeout=STOP_GRACE_S)
            except TimeoutError:
                self.signal(signal.SIGKILL)
        code = await exited
        if drain is not None:
            await drain
        else:
            await pump
        return code

    @staticmethod
    async def _discard(proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while await proc.stdout.read(READ_CHUNK):
            pass

    async def _supervise(self) -> None:
        while True:
            proc = self.proc
            assert proc is not None
            started = time.monotonic()
            code = await self._wait_and_read(proc)
            if self.stopping:
                return
            if time.monotonic() - started >= STABLE_AFTER_S:
                self.restarts = 0
            self.restarts += 1
            delay = min(self.max_backoff, 2.0 ** min(self.restarts - 1, 5))
            self.emit(
                "omni up",
                "",
                f"{self.spec.name} exited with code {code}; restart #{self.restarts} in {delay:.0f}s",
            )
            self.on_exit(self, code)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=delay)
            if self.stopping:
                return
            await self._spawn()
            if self.stopping:  # stop() came while it was spawning: this process got no signal yet
                self.signal(signal.SIGTERM)

    def signal(self, sig: signal.Signals) -> None:
        """Send `sig` to the process group (no-op once it has exited)."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def begin_stop(self) -> None:
        self.stopping = True
        self._wake.set()
        self.signal(signal.SIGTERM)

    async def stop(self, *, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds; never restarts afterwards."""
        self.begin_stop()
        await self.wait_stopped(grace=grace)

    async def wait_stopped(self, *, grace: float) -> None:
        if self.proc is not None and self.proc.returncode is None:
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=grace)
            except TimeoutError:
                self.emit("omni up", "", f"{self.spec.name} did not stop in {grace:.0f}s; killing it")
                self.signal(signal.SIGKILL)
                await self.proc.wait()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        # Anything the process left in its group (it exited first) goes too.
        self.signal(signal.SIGKILL)


@dataclass
class LocalWorker:
    plan: WorkerPlan
    processes: list[ManagedProcess]
    gpus: tuple[int, ...] = ()
    phase: WorkerState = WorkerState.starting
    started_at: float = field(default_factory=time.monotonic)
    admitted: bool = False
    ever_admitted: bool = False
    draining_since: float | None = None
    sessions: int | None = None
    retiring: bool = False  # being stopped: out of the table, processes stopping

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def revision(self) -> str:
        return self.plan.revision

    @property
    def ready_url(self) -> str:
        """The API pod's readiness URL: /ready for the builtin runtime, /health for third-party ones."""
        path = self.plan.pods[0].container.readiness_path or "/ready"
        return f"{self.plan.api_url}{path}"

    def row(self) -> dict[str, object]:
        """This worker's entry in the router's worker table (pids: extra, for people and tests)."""
        return {
            "id": self.name,
            "url": self.plan.api_url,
            "revision": self.revision,
            "state": self.phase.value,
            "pids": [p.pid for p in self.processes if p.pid is not None],
        }

    def view(self) -> WorkerView:
        return WorkerView(
            name=self.name,
            index=self.plan.index,
            revision=self.revision,
            phase=WorkerState.draining if self.retiring else self.phase,
            admitted=self.admitted and not self.retiring,
            ever_admitted=self.ever_admitted,
            started_at=self.started_at,
            draining_since=self.draining_since,
            sessions=0 if self.retiring else self.sessions,
        )
