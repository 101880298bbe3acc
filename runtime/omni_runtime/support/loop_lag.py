"""How late a process's event loop runs what is due.

A worker's event loop accepts connections, parses requests, hands each stream its tokens from the
stage threads and writes every SSE chunk. When it is busy all of that waits, and a client sees the
wait as time outside the worker's stages (the bench's "outside the worker"). `watch_loop_lag` asks
to wake every ``interval`` seconds and reports how late each wake came.

The stage threads share the interpreter with the loop: a thread that holds it gives it up when a
torch call releases it or, at the latest, after the interpreter's switch interval (5 ms), and a
thread that released it often takes it back before the loop's thread wakes. `apply_switch_interval`
sets that interval from ``OMNI_SWITCH_INTERVAL_MS``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Mapping

from omni_runtime.contract import switches

log = logging.getLogger("omni.runtime")

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


def apply_switch_interval(environ: Mapping[str, str]) -> float:
    """Set the interpreter's switch interval from ``OMNI_SWITCH_INTERVAL_MS`` (unset: left as it
    is); the interval in seconds now in force."""
    ms = switches.read("OMNI_SWITCH_INTERVAL_MS", environ)
    if ms is not None:
        sys.setswitchinterval(ms / 1000)
        log.info("interpreter switch interval: %.2f ms (OMNI_SWITCH_INTERVAL_MS)", ms)
    return sys.getswitchinterval()
