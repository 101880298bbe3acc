"""Garbage-collector pauses: timed per generation once per process, exported to Prometheus by any
number of registries, logged when long; the startup heap frozen out of full collections."""

from __future__ import annotations

import gc
import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from omni_runtime.support.gc_pauses import (
    PAUSE_BUCKETS,
    GcPauses,
    collections,
    freeze_heap,
    longest_pause,
    watch_gc,
)


@pytest.fixture(autouse=True)
def watching():
    watch_gc(warn_above_s=0.05)
    yield
    watch_gc(warn_above_s=0.05)


def samples(prefix: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(GcPauses(prefix))
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_each_full_collection_is_timed_in_the_generation_2_histogram() -> None:
    before = collections(2)
    gc.collect(2)
    gc.collect(2)
    now = collections(2)
    assert now >= before + 2  # other threads may collect too; never fewer
    assert longest_pause(2) > 0
    got = samples("test")
    gen2 = (("generation", "2"),)
    assert got[("test_gc_pause_seconds_count", gen2)] >= now
    assert got[("test_gc_pause_seconds_sum", gen2)] >= longest_pause(2)
    # Buckets are cumulative and end at +Inf with the count.
    bounds = [*(str(b) for b in PAUSE_BUCKETS), "+Inf"]
    counts = [got[("test_gc_pause_seconds_bucket", (("generation", "2"), ("le", le)))] for le in bounds]
    assert counts == sorted(counts) and counts[-1] == got[("test_gc_pause_seconds_count", gen2)]
    assert ("test_gc_frozen_objects", ()) in got


def test_two_registries_report_the_same_process_under_their_own_prefix() -> None:
    gc.collect(2)
    worker, router = samples("omni"), samples("omni_router")
    gen2 = (("generation", "2"),)
    assert (
        worker[("omni_gc_pause_seconds_count", gen2)] == router[("omni_router_gc_pause_seconds_count", gen2)]
    )


def test_one_callback_however_often_watching_starts() -> None:
    watch_gc()
    watch_gc()
    timed = [cb for cb in gc.callbacks if getattr(cb, "__qualname__", "") == "_ProcessGc.callback"]
    assert len(timed) == 1


def test_a_young_collection_counts_in_its_own_generation() -> None:
    before = collections(0)
    gc.collect(0)
    assert collections(0) >= before + 1


def test_a_pause_over_the_threshold_is_logged_with_its_generation(caplog: pytest.LogCaptureFixture) -> None:
    watch_gc(warn_above_s=0.0)
    with caplog.at_level(logging.WARNING, logger="omni_runtime.support.gc_pauses"):
        gc.collect(1)
    assert any(
        "garbage collection (generation 1) stopped this process for" in r.message for r in caplog.records
    )


def test_freeze_heap_moves_live_objects_out_of_collection() -> None:
    try:
        frozen = freeze_heap("test")
        assert frozen > 0
        # Full passes now walk far fewer objects than were frozen (frozen objects freed by
        # reference count since leave the permanent generation, so only compare loosely).
        assert len(gc.get_objects()) < frozen
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()  # tests share one process: give the objects back to the collector


def test_a_scrape_reports_the_count_frozen_without_walking_the_permanent_generation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    try:
        frozen = freeze_heap("test")

        def walk() -> int:  # a million scattered objects: ~140 ms with the GIL held, per scrape
            raise AssertionError("a scrape walked the permanent generation")

        monkeypatch.setattr(gc, "get_freeze_count", walk)
        assert samples("test")[("test_gc_frozen_objects", ())] == frozen
    finally:
        monkeypatch.undo()
        gc.unfreeze()
