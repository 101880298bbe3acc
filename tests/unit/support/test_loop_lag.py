"""The event loop's lag watch on a real asyncio loop: near zero while the loop is free, about the
length of a call that blocks it."""

from __future__ import annotations

import asyncio
import time

from omni_runtime.support.loop_lag import watch_loop_lag


def test_a_blocked_loop_shows_as_one_late_wake() -> None:
    lags: list[float] = []

    async def run() -> None:
        watch = asyncio.create_task(watch_loop_lag(lags.append, interval=0.01))
        await asyncio.sleep(0.1)  # free: the watch wakes on time
        free = len(lags)
        time.sleep(0.08)  # a call that holds the loop for 80 ms (what a busy worker's loop does)
        await asyncio.sleep(0.05)
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        assert free >= 3

    asyncio.run(run())
    assert 0.06 <= max(lags) <= 0.3, lags  # the wake due inside the 80 ms came that late
    assert min(lags) >= 0.0
    assert sorted(lags)[len(lags) // 2] < 0.03  # most wakes on time (the CPU is shared in CI)
