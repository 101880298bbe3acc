"""How long work waited for a stage's calls: the histogram's buckets, the kinds, and the
schedulers' admission waits (exact table tests)."""

from __future__ import annotations

import pytest

from omni_runtime.contract.engine import WAIT_BUCKETS
from omni_runtime.pipeline.workers import SchedulerLoop, TimeCounts, window_kind


@pytest.mark.parametrize(
    ("seconds", "bucket"),
    [
        (0.0, 0),
        (0.005, 0),  # a bound belongs to its own bucket (Prometheus' le)
        (0.0051, 1),
        (0.1, 4),
        (0.3, 6),
        (2.5, 8),
        (2.6, 9),  # past the last bound: +Inf
    ],
)
def test_a_wait_lands_in_the_bucket_whose_bound_is_the_first_not_below_it(
    seconds: float, bucket: int
) -> None:
    waits = TimeCounts()
    waits.observe("first", seconds)
    (wait,) = waits.snapshot()
    expected = [0] * (len(WAIT_BUCKETS) + 1)
    expected[bucket] = 1
    assert (wait.kind, list(wait.counts), wait.sum_s, wait.count) == ("first", expected, seconds, 1)


@pytest.mark.parametrize(
    ("key", "kind"),
    [(None, "all"), ((0, 0.0, 3), "first"), ((1, 12.5, 4), "later"), ((1, -0.2, 0), "later")],
)
def test_a_queued_item_s_kind_comes_from_its_place_in_line(key, kind: str) -> None:
    assert window_kind(key) == kind


def test_two_workers_on_one_thread_add_up_by_kind() -> None:
    audio, vision = TimeCounts(), TimeCounts()
    audio.observe("all", 0.002)
    vision.observe("all", 0.2)
    vision.observe("admission", 0.03)
    total = TimeCounts()
    total.add(audio)
    total.add(vision)
    got = {w.kind: (w.count, round(w.sum_s, 6)) for w in total.snapshot()}
    assert got == {"admission": (1, 0.03), "all": (2, 0.202)}


class _Line(SchedulerLoop[str]):
    pass


def test_a_scheduler_counts_the_admitted_and_forgets_what_left_the_line_unadmitted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter([10.0, 10.5, 11.0, 12.25])
    monkeypatch.setattr("omni_runtime.pipeline.workers.time.monotonic", lambda: next(clock))
    line = _Line()
    line.submit("a")  # 10.0
    line.submit("b")  # 10.5
    line.submit("gone")  # 11.0
    line._unqueue("gone")  # cancelled while waiting
    admitted = [line.waiting.popleft(), line.waiting.popleft()]
    line._admitted(admitted)  # 12.25
    (wait,) = line.waits.snapshot()
    assert (wait.kind, wait.count, wait.sum_s) == ("admission", 2, 2.25 + 1.75)
    assert not line.waiting and not line._submitted
