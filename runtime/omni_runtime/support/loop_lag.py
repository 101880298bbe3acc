"""How late a process's event loop runs what is due.

A worker's event loop accepts connections, parses requests, hands each stream its tokens from the
stage threads and writes every SSE chunk. When it is busy all of that waits, and a client sees the
wait as time outside the worker's stages (the bench's "outside the worker"). `watch_loop_lag` asks
to wake every ``interval`` seconds and reports how late each wake came.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

METRIC = "omni_event_loop_lag_seconds"  # the histogram a worker's /metrics keeps of the lag
LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # seconds
INTERVAL_S = 0.02


async def watch_loop_lag(observe: Callable[[float], None], interval: float = INTERVAL_S) -> None:
    """Until cancelled: sleep ``interval`` on the running loop and ``observe`` how many seconds
    after it was due the loop woke this task (never below 0)."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval
        await asyncio.sleep(interval)
        observe(max(0.0, loop.time() - due))
