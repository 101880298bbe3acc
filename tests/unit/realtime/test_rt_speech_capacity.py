"""Admission by speech capacity: the decision table, slot bookkeeping, the refusal and /metrics."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from omni_runtime.realtime.capacity import (
    SpeechCapacity,
    SpeechCapacityCollector,
    admits,
    refusal_headers,
)


@pytest.mark.parametrize(
    ("limit", "in_use", "admitted"),
    [
        (0, 0, True),  # 0: no limit
        (0, 1000, True),
        (-1, 5, True),
        (1, 0, True),
        (1, 1, False),
        (16, 15, True),
        (16, 16, False),
        (16, 17, False),  # never happens, still refused
    ],
)
def test_admits(limit: int, in_use: int, admitted: bool) -> None:
    assert admits(limit=limit, in_use=in_use) is admitted


def test_slots_are_counted_released_once_and_refusals_by_kind() -> None:
    capacity = SpeechCapacity(limit=2)
    a = capacity.acquire("chat")
    b = capacity.acquire("realtime")
    assert a is not None and b is not None and capacity.in_use == 2
    assert capacity.acquire("chat") is None
    assert capacity.acquire("video") is None
    assert capacity.acquire("chat") is None
    assert capacity.refused == {"chat": 2, "video": 1}
    a.release()
    a.release()  # idempotent: every exit path may release
    assert capacity.in_use == 1
    c = capacity.acquire("video")
    assert c is not None and capacity.in_use == 2
    b.release()
    c.release()
    assert capacity.in_use == 0


def test_refusal_names_the_limit_and_the_flag() -> None:
    error = SpeechCapacity(limit=3).error()
    assert (error.status, error.code, error.type, error.param) == (
        429,
        "speech_capacity_reached",
        "rate_limit_exceeded",
        None,
    )
    assert "3 concurrent speech streams" in error.message and "--max-speech-streams 3" in error.message
    assert refusal_headers() == {"retry-after": "1", "x-omni-capacity": "speech"}


def test_metrics_show_limit_in_use_and_refusals() -> None:
    capacity = SpeechCapacity(limit=1)
    registry = CollectorRegistry()
    registry.register(SpeechCapacityCollector(capacity))
    capacity.acquire("chat")
    capacity.acquire("realtime")
    lines = set(generate_latest(registry).decode().splitlines())
    assert "omni_speech_streams_limit 1.0" in lines
    assert "omni_speech_streams_in_use 1.0" in lines
    assert 'omni_speech_streams_refused_total{kind="realtime"} 1.0' in lines
    assert not any(line.startswith('omni_speech_streams_refused_total{kind="chat"}') for line in lines)
