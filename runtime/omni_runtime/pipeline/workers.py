"""Stage workers: a dedicated thread per stage for torch calls, and request batching for encoders.

The event loop must stay free for HTTP while models run, so every heavy call goes to the stage's
own single thread (a stage's modules are never entered by two threads at once, and CUDA work of
one stage stays in order). ``BatchingWorker`` collects the requests that arrived while the
previous call ran and hands them to the model in one call: in arrival order, or, given an
``order`` (the vocoder's playback deadlines, `pipeline.deadlines`), most urgent first.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from omni_runtime.contract.engine import WAIT_BUCKETS, TimeHistogram
from omni_runtime.pipeline import deadlines

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")
JobT = TypeVar("JobT")


class StageThread:
    """One thread that runs a stage's calls in order, and counts how long it was busy.

    ``busy_s`` (wall time inside calls, GPU waits included) over a load's duration is the stage's
    utilisation: the stage near 1.0 is the one that limits a worker (``omni_stage_busy_seconds``).
    ``after_cancel_s`` is the part of it spent after a request in the running call was cancelled
    (``note_cancel``): the work a cancel could not stop, at most the rest of one call. A call that
    runs on for longer than ``SLOW_AFTER_CANCEL_S`` past a cancel is logged with its name and the
    thread's CPU time in it (``last_after_cancel``): little CPU in a long call means it waited, for
    the GPU behind other stages' kernels or for the GIL behind another thread.
    """

    SLOW_AFTER_CANCEL_S = 0.05

    def __init__(self, name: str, *, initializer: Callable[[], None] | None = None) -> None:
        self.name = name
        # The initializer gives the thread its own CUDA stream (see the adapter), so one stage's
        # kernels never queue behind another's on a shared GPU.
        self._pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"stage-{name}", initializer=initializer
        )
        self.busy_s = 0.0
        self.calls = 0
        self.after_cancel_s = 0.0
        self.last_after_cancel: AfterCancel | None = None
        self.waiting = 0  # calls submitted that have not started (queued behind the running one)
        self._lock = threading.Lock()  # the call's start and its first cancel: thread vs event loop
        self._running = False
        self._cancelled_at: float | None = None

    @property
    def idle(self) -> bool:
        """No call running or waiting for the thread."""
        with self._lock:
            return not self._running and self.waiting == 0

    def note_cancel(self) -> None:
        """A request the running call works for was cancelled: time the rest of that call."""
        with self._lock:
            if self._running and self._cancelled_at is None:
                self._cancelled_at = time.perf_counter()

    async def run(self, fn: Callable[..., R], *args: Any) -> R:
        loop = asyncio.get_running_loop()
        call = _Call()
        with self._lock:
            self.waiting += 1
        try:
            return await loop.run_in_executor(self._pool, self._timed, call, fn, *args)
        finally:
            with self._lock:
                if not call.started:  # cancelled while waiting: the thread must not run it now
                    call.abandoned = True
                    self.waiting -= 1

    def _timed(self, call: _Call, fn: Callable[..., R], *args: Any) -> R:
        with self._lock:
            if call.abandoned:  # its caller is gone (a cancel): nobody would read the result
                return None  # type: ignore[return-value]
            call.started = True
            self.waiting -= 1
            self._running = True
        started, cpu_started = time.perf_counter(), time.thread_time()
        try:
            return fn(*args)
        finally:  # only this thread writes the counters; readers may see them one call late
            ended = time.perf_counter()
            with self._lock:
                self._running = False
                cancelled_at, self._cancelled_at = self._cancelled_at, None
            self.busy_s += ended - started
            self.calls += 1
            if cancelled_at is not None:
                self._after_cancel(
                    AfterCancel(
                        call=_call_name(fn),
                        after_s=ended - cancelled_at,
                        call_s=ended - started,
                        cpu_s=time.thread_time() - cpu_started,
                    )
                )

    def _after_cancel(self, record: AfterCancel) -> None:
        self.after_cancel_s += record.after_s
        self.last_after_cancel = record
        if record.after_s > self.SLOW_AFTER_CANCEL_S:
            log.info(
                "stage %s: %s ran %.0f ms past a cancel (the call %.0f ms, %.0f ms of it on this thread's CPU)",
                self.name,
                record.call,
                record.after_s * 1e3,
                record.call_s * 1e3,
                record.cpu_s * 1e3,
            )

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


@dataclasses.dataclass(frozen=True)
class AfterCancel:
    """The call a cancel found running on a stage thread: how long it went on past the cancel, its
    whole wall time, and the thread's CPU time in it."""

    call: str
    after_s: float
    call_s: float
    cpu_s: float


def _call_name(fn: Callable[..., Any]) -> str:
    inner = getattr(fn, "func", fn)  # functools.partial
    return getattr(inner, "__qualname__", type(inner).__name__)


class _Call:
    """One call's hand-over between the event loop and the stage thread (under the thread's lock)."""

    __slots__ = ("abandoned", "started")

    def __init__(self) -> None:
        self.started = False
        self.abandoned = False


class TimeCounts:
    """Histograms of durations by kind (``TimeHistogram``): how long work waited for a stage's
    calls, or how long each phase of a reply's way to first audio took."""

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {}
        self._sums: dict[str, float] = {}

    def observe(self, kind: str, seconds: float) -> None:
        counts = self._counts.setdefault(kind, [0] * (len(WAIT_BUCKETS) + 1))
        counts[bisect.bisect_left(WAIT_BUCKETS, seconds)] += 1
        self._sums[kind] = self._sums.get(kind, 0.0) + seconds

    def snapshot(self) -> tuple[TimeHistogram, ...]:
        return tuple(
            TimeHistogram(kind=kind, counts=tuple(counts), sum_s=self._sums[kind])
            for kind, counts in sorted(self._counts.items())
        )

    def add(self, other: TimeCounts) -> None:
        """Count ``other``'s durations here too (two workers sharing one stage thread)."""
        for kind, counts in other._counts.items():
            mine = self._counts.setdefault(kind, [0] * (len(WAIT_BUCKETS) + 1))
            mine[:] = [a + b for a, b in zip(mine, counts, strict=True)]
            self._sums[kind] = self._sums.get(kind, 0.0) + other._sums[kind]


def window_kind(key: deadlines.Priority | None) -> str:
    """What a queued item is, for its wait: a stream's first window, a later one, or unordered."""
    if key is None:
        return "all"
    return "first" if key[0] == 0 else "later"


class BatchingWorker(Generic[T, R]):
    """Calls ``fn(items) -> results`` (same length, same order) with whatever is queued, up to ``max_batch``."""

    def __init__(
        self,
        name: str,
        fn: Callable[[list[T]], list[R]],
        *,
        thread: StageThread,
        max_batch: int = 16,
        order: Callable[[T, int], deadlines.Priority] | None = None,
        group: Callable[[T], Hashable] | None = None,
    ) -> None:
        self.name = name
        self._fn = fn
        self.thread = thread
        self._max_batch = max_batch
        # order(item, arrival number) -> sort key, taken at submission; None: arrival order.
        self._order = order
        # group(item) -> key: with an order, a call takes only items of its most urgent one's group.
        self._group = group
        # With an order: far windows keep out of nearer ones' calls, and calls of them stay short.
        self.far: deadlines.FarWindows | None = None
        # near(within_s) -> whether a live stream has less than that much audio left (the engine's
        # play heads, `Engine.streams_near`); None: unknown (a vocoder behind a stage link), where a
        # near_only bound never holds (calls as full as the line allows, as with no bound).
        self.near: Callable[[float], bool] | None = None
        self._arrivals = itertools.count()
        self._queue: asyncio.Queue[tuple[deadlines.Priority | None, tuple[T, asyncio.Future[R]]]] = (
            asyncio.Queue()
        )
        self._waiting: list[tuple[deadlines.Priority, tuple[T, asyncio.Future[R]]]] = []  # ordered only
        self._task: asyncio.Task[None] | None = None
        self.batches = 0
        self.items = 0  # counted when a batch starts: a window of a cancelled request never adds one
        self.max_batch_seen = 0
        self.dropped = 0  # queued items skipped unrun because their caller was cancelled
        self.waits = TimeCounts()  # submitted until its batch's call started, by window_kind
        self._queued: dict[asyncio.Future[R], tuple[float, str]] = {}  # future -> (when, kind)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"worker-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def submit(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        key = self._order(item, next(self._arrivals)) if self._order is not None else None
        self._queued[future] = (time.monotonic(), window_kind(key))
        await self._queue.put((key, (item, future)))
        try:
            return await future
        finally:
            self._queued.pop(future, None)  # cancelled or failed before its batch started

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize() + len(self._waiting)

    async def _next_batch(self) -> list[tuple[T, asyncio.Future[R]]]:
        if self._order is None:  # arrival order; a cancelled item takes no live one's place
            batch = [(await self._queue.get())[1]]
            while len(batch) < self._max_batch and not self._queue.empty():
                entry = self._queue.get_nowait()[1]
                if not self._drop_cancelled(entry):
                    batch.append(entry)
            return batch
        arrived = [] if self._waiting else [await self._queue.get()]
        while not self._queue.empty():
            arrived.append(self._queue.get_nowait())
        self._waiting.extend((key, entry) for key, entry in arrived if key is not None)  # all keyed
        # Windows of cancelled requests leave the line first, so they never take a live one's place.
        self._waiting = [(key, entry) for key, entry in self._waiting if not self._drop_cancelled(entry)]
        group = self._group
        by_item = None if group is None else (lambda entry: group(entry[0]))  # entry: (item, future)
        far = self.far
        near = far is None or not far.near_only or (self.near is not None and self.near(far.after_s))
        batch, self._waiting = deadlines.take(
            self._waiting, self._max_batch, group=by_item, far=far, now=time.monotonic(), near=near
        )
        return batch

    def _drop_cancelled(self, entry: tuple[T, asyncio.Future[R]]) -> bool:
        if entry[1].cancelled():
            self.dropped += 1
            return True
        return False

    def _cancelled_while_running(self, future: asyncio.Future[R]) -> None:
        if future.cancelled():
            self.thread.note_cancel()

    def _fail_waiting(self, exc: Exception) -> None:
        """Fail every queued item: the line itself broke (a bug), and no call would answer them."""
        entries = [entry for _, entry in self._waiting]
        while not self._queue.empty():
            entries.append(self._queue.get_nowait()[1])
        self._waiting = []
        for _, fut in entries:
            if not fut.done():
                fut.set_exception(exc)

    async def _loop(self) -> None:
        while True:
            try:
                batch = await self._next_batch()
            except Exception as exc:  # a bug in ordering or grouping must fail requests, not hang them
                log.exception("stage %s could not pick its next batch; failing what waits", self.name)
                self._fail_waiting(exc)
                continue
            live = [entry for entry in batch if not self._drop_cancelled(entry)]
            if not live:
                continue
            self.batches += 1
            self.items += len(live)
            self.max_batch_seen = max(self.max_batch_seen, len(live))
            now = time.monotonic()
            for _, fut in live:
                fut.add_done_callback(self._cancelled_while_running)
                queued = self._queued.pop(fut, None)
                if queued is not None:
                    self.waits.observe(queued[1], now - queued[0])
            try:
                results = await self.thread.run(self._fn, [item for item, _ in live])
            except Exception as exc:  # one bad batch fails its requests, never the worker
                log.exception("stage %s failed on a batch of %d", self.name, len(live))
                for _, fut in live:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (_, fut), result in zip(live, results, strict=True):
                if not fut.done():
                    fut.set_result(result)


class SchedulerLoop(Generic[JobT]):
    """The lifecycle both continuous-batching schedulers share: one asyncio task repeating
    ``_iteration``, queues of waiting and running jobs, and an event that wakes the loop when work
    arrives. A fault inside an iteration fails the jobs it holds instead of hanging them."""

    task_name = "scheduler"

    def __init__(self) -> None:
        self.waiting: deque[JobT] = deque()
        self.running: list[JobT] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.waits = TimeCounts()  # kind "admission": submitted until taken into a step
        self._submitted: dict[int, float] = {}  # id(job) -> when, while it waits

    def _admitted(self, jobs: list[JobT]) -> None:
        """These waiting jobs are taken into the next step: their waits end now."""
        now = time.monotonic()
        for job in jobs:
            since = self._submitted.pop(id(job), None)
            if since is not None:
                self.waits.observe("admission", now - since)

    def _unqueue(self, job: JobT) -> None:
        """A job leaves the line without being admitted (finished while it waited)."""
        if job in self.waiting:
            self.waiting.remove(job)
        self._submitted.pop(id(job), None)

    async def _iteration(self) -> None:
        raise NotImplementedError

    def _end(self, job: JobT, reason: Any, *, error: str | None = None) -> None:
        raise NotImplementedError

    async def _loop(self) -> None:
        while True:
            try:
                await self._iteration()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug here must fail requests, not hang them all
                log.exception("%s failed; failing its requests", self.task_name)
                for job in [*self.running, *self.waiting]:
                    self._end(job, "error", error=f"{self.task_name} failed: {exc}")
                self.running.clear()
                self.waiting.clear()
                self._submitted.clear()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=self.task_name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(self, job: JobT) -> None:
        self._submitted[id(job)] = time.monotonic()
        self.waiting.append(job)
        self._wake.set()
