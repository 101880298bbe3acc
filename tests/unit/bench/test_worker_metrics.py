"""The bench's account of a level from the worker's /metrics: where time to first audio went."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from omni_runtime.bench.stats import summarize
from omni_runtime.bench.worker_metrics import (
    first_audio_line,
    first_audio_report,
    loop_lag,
    worker_first_audio_s,
    worker_report,
)
from omni_runtime.support.loop_lag import LAG_BUCKETS, METRIC

ALL = {
    "prompt": {"n": 4, "mean_s": 0.02, "over_0.1s": 0.0},
    "first_token": {"n": 4, "mean_s": 0.05, "over_0.1s": 0.0},
    "talker_first_code": {"n": 4, "mean_s": 0.04, "over_0.1s": 0.0},
    "first_window_codes": {"n": 4, "mean_s": 0.2, "over_0.1s": 1.0},
    "first_window": {"n": 4, "mean_s": 0.11, "over_0.1s": 0.5},
}


@pytest.mark.parametrize(
    ("phases", "inside"),
    [
        (ALL, 0.42),
        ({}, None),
        ({k: v for k, v in ALL.items() if k != "first_window"}, None),  # a phase missing: no sum
    ],
)
def test_the_workers_first_audio_is_the_sum_of_its_phases(phases: dict, inside: float | None) -> None:
    assert worker_first_audio_s(phases) == inside


@pytest.mark.parametrize(
    ("client", "line"),
    [
        (
            0.5,
            "  16: worker prompt 0.020 + first_token 0.050 + talker_first_code 0.040 + first_window_codes 0.200"
            " + first_window 0.110 = 0.420 s; client TTFA mean 0.500 s, +0.080 s outside the worker",
        ),
        (
            None,
            "  16: worker prompt 0.020 + first_token 0.050 + talker_first_code 0.040 + first_window_codes 0.200"
            " + first_window 0.110 = 0.420 s",
        ),
    ],
)
def test_first_audio_line(client: float | None, line: str) -> None:
    assert first_audio_line("16", ALL, client) == line
    assert first_audio_line("16", {}, client) is None


def test_first_audio_line_with_the_event_loops_lag() -> None:
    lag = {"n": 40, "mean_s": 0.0035, "over_0.01s": 0.125}
    assert first_audio_line("16", ALL, 0.5, lag) == (
        "  16: worker prompt 0.020 + first_token 0.050 + talker_first_code 0.040 + first_window_codes 0.200"
        " + first_window 0.110 = 0.420 s; client TTFA mean 0.500 s, +0.080 s outside the worker;"
        " event loop 3.5 ms late a wake on average, 12% of 40 wakes over 10 ms"
    )


def _lag_text(*lags: float) -> str:
    """A worker's /metrics text whose lag histogram saw ``lags`` (seconds), as the worker writes it."""
    registry = CollectorRegistry()
    histogram = Histogram(METRIC, "lag", buckets=LAG_BUCKETS, registry=registry)
    for lag in lags:
        histogram.observe(lag)
    return generate_latest(registry).decode()


def test_loop_lag_between_two_metrics_texts() -> None:
    before = _lag_text(0.001, 0.003)
    after = _lag_text(0.001, 0.003, 0.004, 0.05)  # two more wakes: 4 ms and 50 ms late
    assert loop_lag(before, after) == {"n": 2, "mean_s": 0.027, "over_0.01s": 0.5}
    assert loop_lag(before, before) is None  # no wake between them
    assert loop_lag("", "") is None  # a worker without the metric
    assert worker_report(before, after, 1.0)["loop_lag"] == loop_lag(before, after)


def test_first_audio_report_names_the_url_and_each_level_with_phases() -> None:
    level = summarize([], concurrency=16, wall_s=1.0, label="omni")
    with_phases = replace(level, worker={"first_audio_phases": ALL}, ttfa_mean_s=0.5)
    report = first_audio_report([with_phases, replace(level, concurrency=32)], url="http://w:8000/metrics")
    assert report.splitlines() == [
        "where the time to first audio went, means (the worker's http://w:8000/metrics):",
        first_audio_line("16", ALL, 0.5),
    ]
    assert first_audio_report([level], url="http://r/metrics") == (
        "no first-audio phases at http://r/metrics: a worker's /metrics has them for its streaming speech replies"
    )


def test_worker_report_is_empty_without_both_texts() -> None:
    assert worker_report(None, "x", 1.0) == {}
    assert worker_report("x", None, 1.0) == {}
