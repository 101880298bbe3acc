"""The realtime probe's per-round stage shares (from two /metrics texts), and a round against a
scripted worker whose /metrics cannot be read (the router's case): the shares are left out."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from scripted_realtime import scripted_server  # beside this file

from omni_runtime.bench.cancel_tail import metrics_url_of
from omni_runtime.bench.realtime_latency import Probe, measure
from omni_runtime.bench.worker_metrics import first_audio_phases, stage_shares, stage_waits

BEFORE = """\
omni_stage_busy_seconds_total{stage="thinker"} 10.0
omni_stage_busy_seconds_total{stage="talker"} 4.0
omni_stage_busy_seconds_total{stage="vocoder"} 7.0
omni_stage_calls_total{stage="vocoder"} 3.0
"""


@pytest.mark.parametrize(
    ("after", "wall", "shares"),
    [
        (BEFORE, 2.0, {}),  # nothing moved
        (
            BEFORE.replace("10.0", "11.0").replace("7.0", "8.9"),
            2.0,
            {"thinker": 0.5, "vocoder": 0.95},
        ),
        # a stage the first text did not have (it started meanwhile) counts from zero
        (BEFORE + 'omni_stage_busy_seconds_total{stage="audio_encoder"} 0.25\n', 0.5, {"audio_encoder": 0.5}),
        # under 0.1% of the round: left out
        (BEFORE.replace("4.0", "4.0004"), 1.0, {}),
    ],
)
def test_stage_shares(after: str, wall: float, shares: dict[str, float]) -> None:
    assert stage_shares(BEFORE, after, wall) == shares


@pytest.mark.parametrize(
    ("url", "metrics"),
    [
        ("ws://10.0.0.5:8000/v1/realtime", "http://10.0.0.5:8000/metrics"),
        ("wss://worker.example/v1/realtime?model=x", "https://worker.example/metrics"),
        ("http://127.0.0.1:9000/v1/chat/completions", "http://127.0.0.1:9000/metrics"),
    ],
)
def test_metrics_url_of(url: str, metrics: str) -> None:
    assert metrics_url_of(url) == metrics


def test_a_round_without_readable_metrics_reports_latency_and_no_shares() -> None:
    async def run() -> dict:
        server = await scripted_server(
            [
                {"type": "response.created"},
                {"type": "response.output_audio_transcript.delta", "delta": "hi"},
                {"type": "response.output_audio.delta", "delta": ""},
                {"type": "response.done", "response": {"usage": {"input_tokens": 12}}},
            ]
        )
        port = server.sockets[0].getsockname()[1]
        speech = np.zeros(1600, dtype=np.float32)
        probe = Probe(
            url=f"ws://127.0.0.1:{port}/v1/realtime",
            speech=speech,
            turns=2,
            timeout_s=10,
            metrics_url=metrics_url_of(f"ws://127.0.0.1:{port}/v1/realtime"),  # a websocket server only
        )
        try:
            return await measure(probe, concurrency=2)
        finally:
            server.close()
            await server.wait_closed()

    result = asyncio.run(run())
    assert result["samples"] == 4 and result["no_audio"] == 0
    assert [row["input_tokens"] for row in result["by_turn"]] == [12, 12]
    assert result["wall_s"] > 0 and "stages" not in result


def _histogram(name: str, labels: dict[str, str], buckets: list[float], total: float) -> str:
    """A /metrics text with one histogram series (cumulative buckets, as exposed)."""
    bounds = ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "+Inf"]

    def series(extra: dict[str, str]) -> str:
        return ",".join(f'{k}="{v}"' for k, v in sorted({**labels, **extra}.items()))

    lines = [f"# TYPE {name} histogram"]
    for le, value in zip(bounds, buckets, strict=True):
        lines.append(f"{name}_bucket{{{series({'le': le})}}} {value}")
    lines.append(f"{name}_count{{{series({})}}} {buckets[-1]}")
    lines.append(f"{name}_sum{{{series({})}}} {total}")
    return "\n".join(lines) + "\n"


def _waits(stage: str, kind: str, buckets: list[float], total: float) -> str:
    return _histogram("omni_stage_wait_seconds", {"stage": stage, "kind": kind}, buckets, total)


@pytest.mark.parametrize(
    ("before", "after", "waits"),
    [
        # 4 first windows in the round: 1 within 5 ms, 1 within 0.1 s, 2 over it; 0.9 s in all
        (
            _waits("vocoder", "first", [2, 2, 2, 2, 3, 3, 3, 3, 3, 3], 0.5),
            _waits("vocoder", "first", [3, 3, 3, 3, 5, 6, 7, 7, 7, 7], 1.4),
            {"vocoder/first": {"n": 4, "mean_s": 0.225, "over_0.1s": 0.5}},
        ),
        # nothing new: left out
        (_waits("talker", "admission", [1] * 10, 0.001), _waits("talker", "admission", [1] * 10, 0.001), {}),
        # a series the first text lacked counts from zero
        (
            "",
            _waits("thinker", "admission", [0, 0, 0, 4, 4, 4, 4, 4, 4, 4], 0.12),
            {"thinker/admission": {"n": 4, "mean_s": 0.03, "over_0.1s": 0.0}},
        ),
    ],
)
def test_stage_waits(before: str, after: str, waits: dict) -> None:
    assert stage_waits(before, after) == waits


def test_first_audio_phases_per_round() -> None:
    def phase(name: str, buckets: list[float], total: float) -> str:
        return _histogram("omni_first_audio_phase_seconds", {"phase": name}, buckets, total)

    before = phase("first_window", [1, 1, 1, 1, 1, 1, 1, 1, 1, 1], 0.004)
    after = phase("first_window", [1, 1, 1, 2, 2, 3, 3, 3, 3, 3], 0.2)
    assert first_audio_phases(before, after) == {"first_window": {"n": 2, "mean_s": 0.098, "over_0.1s": 0.5}}
