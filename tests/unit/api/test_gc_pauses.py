"""Garbage-collector pauses: timed per generation, exported to Prometheus, logged when long; the
startup heap frozen out of full collections."""

from __future__ import annotations

import gc
import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from omni_runtime.gc_pauses import PAUSE_BUCKETS, GcPauses, freeze_heap


@pytest.fixture
def pauses():
    watch = GcPauses("test").install()
    yield watch
    watch.uninstall()


def samples(watch: GcPauses) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(watch)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_each_full_collection_is_timed_in_the_generation_2_histogram(pauses: GcPauses) -> None:
    before = pauses.collections(2)
    gc.collect(2)
    gc.collect(2)
    assert pauses.collections(2) == before + 2
    assert pauses.longest[2] > 0
    got = samples(pauses)
    gen2 = (("generation", "2"),)
    assert got[("test_gc_pause_seconds_count", gen2)] == before + 2
    assert got[("test_gc_pause_seconds_sum", gen2)] >= pauses.longest[2]
    # Buckets are cumulative and end at +Inf with the count.
    counts = [
        got[("test_gc_pause_seconds_bucket", (("generation", "2"), ("le", le)))]
        for le in [*(str(b) for b in PAUSE_BUCKETS), "+Inf"]
    ]
    assert counts == sorted(counts) and counts[-1] == before + 2
    assert ("test_gc_frozen_objects", ()) in got


def test_a_young_collection_counts_in_its_own_generation(pauses: GcPauses) -> None:
    before = (pauses.collections(0), pauses.collections(2))
    gc.collect(0)
    assert (pauses.collections(0), pauses.collections(2)) == (before[0] + 1, before[1])


def test_a_pause_over_the_threshold_is_logged_with_its_generation(caplog: pytest.LogCaptureFixture) -> None:
    watch = GcPauses("test", warn_above_s=0.0).install()
    try:
        with caplog.at_level(logging.WARNING, logger="omni_runtime.gc_pauses"):
            gc.collect(1)
    finally:
        watch.uninstall()
    assert any(
        "garbage collection (generation 1) stopped this process for" in r.message for r in caplog.records
    )


def test_uninstalled_watch_no_longer_counts() -> None:
    watch = GcPauses("test").install()
    watch.uninstall()
    watch.uninstall()  # twice is harmless
    gc.collect(2)
    assert watch.collections(2) == 0
    assert watch._callback not in gc.callbacks


def test_freeze_heap_moves_live_objects_out_of_collection() -> None:
    try:
        frozen = freeze_heap("test")
        assert frozen == gc.get_freeze_count() > 0
        tracked_after = len(gc.get_objects())
        assert tracked_after < frozen  # full passes now walk far fewer objects than were frozen
    finally:
        gc.unfreeze()  # tests share one process: give the objects back to the collector
