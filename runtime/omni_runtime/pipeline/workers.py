"""Stage workers: a dedicated thread per stage for torch calls, and request batching for encoders.

The event loop must stay free for HTTP while models run, so every heavy call goes to the stage's
own single thread (a stage's modules are never entered by two threads at once, and CUDA work of
one stage stays in order). ``BatchingWorker`` collects the requests that arrived while the
previous call ran and hands them to the model in one call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")
JobT = TypeVar("JobT")


class StageThread:
    """One thread that runs a stage's calls in order, and counts how long it was busy.

    ``busy_s`` (wall time inside calls, GPU waits included) over a load's duration is the stage's
    utilisation: the stage near 1.0 is the one that limits a worker (``omni_stage_busy_seconds``).
    """

    def __init__(self, name: str, *, initializer: Callable[[], None] | None = None) -> None:
        self.name = name
        # The initializer gives the thread its own CUDA stream (see the adapter), so one stage's
        # kernels never queue behind another's on a shared GPU.
        self._pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"stage-{name}", initializer=initializer
        )
        self.busy_s = 0.0
        self.calls = 0

    async def run(self, fn: Callable[..., R], *args: Any) -> R:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._timed, fn, *args)

    def _timed(self, fn: Callable[..., R], *args: Any) -> R:
        started = time.perf_counter()
        try:
            return fn(*args)
        finally:  # only this thread writes the counters; readers may see them one call late
            self.busy_s += time.perf_counter() - started
            self.calls += 1

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class BatchingWorker(Generic[T, R]):
    """Calls ``fn(items) -> results`` (same length, same order) with whatever is queued, up to ``max_batch``."""

    def __init__(
        self, name: str, fn: Callable[[list[T]], list[R]], *, thread: StageThread, max_batch: int = 16
    ) -> None:
        self.name = name
        self._fn = fn
        self.thread = thread
        self._max_batch = max_batch
        self._queue: asyncio.Queue[tuple[T, asyncio.Future[R]]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.batches = 0
        self.items = 0
        self.max_batch_seen = 0

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
        await self._queue.put((item, future))
        return await future

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

    async def _loop(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self._max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            live = [(item, fut) for item, fut in batch if not fut.cancelled()]
            if not live:
                continue
            self.batches += 1
            self.items += len(live)
            self.max_batch_seen = max(self.max_batch_seen, len(live))
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
        self.waiting.append(job)
        self._wake.set()
