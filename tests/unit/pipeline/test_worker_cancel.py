"""Cancellation in the stage workers: a queued item of a cancelled caller is dropped before it runs,
and the rest of a running call after a cancel is counted (real threads; counters, not timing)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from omni_runtime.pipeline.deadlines import priority
from omni_runtime.pipeline.workers import BatchingWorker, StageThread


def _deadline_order(item: str, seq: int) -> tuple[int, float, int]:
    return priority(slack_s=None, now=0.0, seq=seq)


@pytest.mark.parametrize("ordered", [False, True], ids=["arrival-order", "deadline-order"])
async def test_cancelled_queued_items_never_run(ordered: bool) -> None:
    calls: list[list[str]] = []
    release = threading.Event()
    started = threading.Event()

    def fn(items: list[str]) -> list[str]:
        calls.append(list(items))
        if items == ["busy"]:
            started.set()
            release.wait(timeout=30)  # the stage is busy while the others queue up
        return [item.upper() for item in items]

    thread = StageThread("vocoder-test")
    worker: BatchingWorker[str, str] = BatchingWorker(
        "talker_stream", fn, thread=thread, max_batch=4, order=_deadline_order if ordered else None
    )
    worker.start()
    try:
        busy = asyncio.ensure_future(worker.submit("busy"))
        while not started.is_set():
            await asyncio.sleep(0.01)
        names = ["keep-1", "gone-1", "keep-2", "gone-2", "gone-3"]
        futures = {n: asyncio.ensure_future(worker.submit(n)) for n in names}
        while worker.queue_depth < len(names):
            await asyncio.sleep(0.01)
        for name in ("gone-1", "gone-2", "gone-3"):
            futures[name].cancel()
        await asyncio.sleep(0)  # the cancels reach the worker's futures
        release.set()
        assert await asyncio.gather(busy, futures["keep-1"], futures["keep-2"]) == [
            "BUSY",
            "KEEP-1",
            "KEEP-2",
        ]
    finally:
        await worker.stop()
        thread.shutdown()
    assert calls == [["busy"], ["keep-1", "keep-2"]]
    assert (worker.items, worker.dropped) == (3, 3)
    # Only what ran waited: a cancelled item's wait is never counted, whatever its kind.
    (wait,) = worker.waits.snapshot()
    assert (wait.kind, wait.count) == ("first" if ordered else "all", 3)
    assert not worker._queued  # no cancelled item's stamp is left behind
    assert thread.after_cancel_s == 0.0  # no running call had a cancelled item


async def test_the_rest_of_a_running_call_after_a_cancel_is_counted() -> None:
    release = threading.Event()
    started = threading.Event()

    def fn(items: list[str]) -> list[str]:
        started.set()
        release.wait(timeout=30)
        return items

    thread = StageThread("vocoder-test")
    worker: BatchingWorker[str, str] = BatchingWorker("talker_stream", fn, thread=thread)
    worker.start()
    try:
        running = asyncio.ensure_future(worker.submit("window"))
        while not started.is_set():
            await asyncio.sleep(0.01)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        assert thread.after_cancel_s == 0.0  # still running: counted when the call ends
        release.set()
        while thread.calls < 1:
            await asyncio.sleep(0.01)
    finally:
        await worker.stop()
        thread.shutdown()
    assert (worker.items, worker.dropped) == (1, 0)  # it was running: not dropped, its rest timed
    assert 0.0 < thread.after_cancel_s <= thread.busy_s
    record = thread.last_after_cancel  # which call it was, and that it waited rather than computed
    assert record is not None and record.call.endswith("fn")
    assert record.after_s == thread.after_cancel_s and record.after_s <= record.call_s
    assert record.cpu_s < record.call_s / 2  # blocked on an event: little CPU, as a GPU wait is


async def test_a_cancel_between_calls_times_nothing() -> None:
    thread = StageThread("idle-test")
    try:
        thread.note_cancel()  # no call running: nothing is left to stop
        assert await thread.run(lambda: 7) == 7
    finally:
        thread.shutdown()
    assert thread.after_cancel_s == 0.0 and thread.calls == 1


async def test_a_call_cancelled_while_waiting_for_the_thread_never_runs() -> None:
    release = threading.Event()
    started = threading.Event()
    ran: list[str] = []

    def hold() -> None:
        started.set()
        release.wait(timeout=30)

    thread = StageThread("handover-test")
    try:
        busy = asyncio.ensure_future(thread.run(hold))
        while not started.is_set():
            await asyncio.sleep(0.01)
        queued = asyncio.ensure_future(thread.run(lambda: ran.append("queued")))
        await asyncio.sleep(0)
        assert thread.waiting == 1 and not thread.idle
        queued.cancel()
        await asyncio.gather(queued, return_exceptions=True)
        assert thread.waiting == 0
        release.set()
        await busy
        assert await thread.run(lambda: "after") == "after"
    finally:
        thread.shutdown()
    assert ran == [] and thread.idle and thread.calls == 2
