"""Garbage-collector pauses: keep full collections short in serving processes, and measure them.

A worker holds the objects of torch, transformers, tokenizers and the model's module tree:
about half a million tracked objects once it has warmed up. CPython's full (generation 2)
collection walks all of them, and under load one runs every few seconds. On the development
machine each took 280-340 ms with the event loop and the thinker's thread both stopped, so every
request in flight at that moment (a whole batch) finished ~300 ms late: the 64-client p99 of the
router benchmark was made of those cohorts, direct and routed alike.

`freeze_heap()` moves everything alive at that moment into the permanent generation
(`gc.freeze`), which full collections skip; a worker (and an `omni stage` process) calls it once
warm-up is over, a tensor-parallel follower once loaded and captured, the router once it serves.
What is allocated afterwards (requests, sessions) is still collected as before.

`watch_gc()` times every collection of the process through one `gc.callbacks` entry and logs a
warning for each pause longer than a threshold; `GcPauses` exports them as the Prometheus
histogram `<prefix>_gc_pause_seconds{generation}` plus the frozen object count. The callback runs inside the collector, in
whichever thread triggered it, so it only does integer arithmetic and, rarely, one log line;
the histogram families are built at scrape time.

The frozen count is the one `freeze_heap()` read when it froze: `gc.get_freeze_count()` walks the
permanent generation's list, a million scattered objects in a warm worker. On an H200 host each
call held the GIL for about 140 ms, so every /metrics scrape stopped every stage thread that long
(a cancel probe polling /metrics saw its own stalls as the work left after a cancel).
"""

from __future__ import annotations

import bisect
import gc
import itertools
import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

PAUSE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
GENERATIONS = (0, 1, 2)


def freeze_heap(what: str) -> int:
    """Collect once, then freeze every surviving object out of later collections.

    Returns how many objects are frozen (all frozen so far, this call's included)."""
    began = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = _PROCESS.frozen = gc.get_freeze_count()  # walks the list once, here, not per scrape
    log.info(
        "%s: froze %d startup objects out of the garbage collector's passes (%.0f ms)",
        what,
        frozen,
        (time.perf_counter() - began) * 1000,
    )
    return frozen


class _ProcessGc:
    """The process's collections, timed by one gc callback (collections are per process, not per app)."""

    def __init__(self) -> None:
        # Per generation: one count per bucket (the last one is +Inf), the sum, the longest pause.
        self.buckets = {g: [0] * (len(PAUSE_BUCKETS) + 1) for g in GENERATIONS}
        self.sum = dict.fromkeys(GENERATIONS, 0.0)
        self.longest = dict.fromkeys(GENERATIONS, 0.0)
        self.warn_above_s = 0.05
        self.frozen = 0  # objects in the permanent generation, as of the last freeze_heap()
        self._started = 0.0

    def callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        generation = info["generation"]
        self.buckets[generation][bisect.bisect_left(PAUSE_BUCKETS, pause)] += 1
        self.sum[generation] += pause
        if pause > self.longest[generation]:
            self.longest[generation] = pause
        if pause > self.warn_above_s:
            log.warning(
                "garbage collection (generation %d) stopped this process for %.0f ms; %d objects frozen",
                generation,
                pause * 1000,
                self.frozen,
            )


_PROCESS = _ProcessGc()


def watch_gc(*, warn_above_s: float | None = None) -> None:
    """Start timing this process's collections (once; later calls only change the threshold)."""
    if warn_above_s is not None:
        _PROCESS.warn_above_s = warn_above_s
    if _PROCESS.callback not in gc.callbacks:
        gc.callbacks.append(_PROCESS.callback)


def collections(generation: int) -> int:
    """Collections of this generation timed so far in this process."""
    return sum(_PROCESS.buckets[generation])


def longest_pause(generation: int) -> float:
    return _PROCESS.longest[generation]


class GcPauses(Collector):
    """A Prometheus collector of the process's collection pauses, named with a metric prefix.

    Any number of registries (several apps in one test process) may hold one; `watch_gc()`
    starts the timing they all read."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def collect(self) -> Iterator[GaugeMetricFamily | HistogramMetricFamily]:
        histogram = HistogramMetricFamily(
            f"{self.prefix}_gc_pause_seconds",
            "Time the garbage collector stopped this process, per collection.",
            labels=["generation"],
        )
        bounds = [*(str(b) for b in PAUSE_BUCKETS), "+Inf"]
        for generation in GENERATIONS:
            cumulative = list(itertools.accumulate(_PROCESS.buckets[generation]))
            histogram.add_metric(
                [str(generation)], list(zip(bounds, cumulative, strict=True)), _PROCESS.sum[generation]
            )
        yield histogram
        yield GaugeMetricFamily(
            f"{self.prefix}_gc_frozen_objects",
            "Objects frozen out of garbage collection once the process was ready.",
            value=_PROCESS.frozen,
        )
