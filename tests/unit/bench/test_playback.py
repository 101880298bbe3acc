"""Playback of synthetic audio timelines: TTFA, underrun, RTF and the level numbers, exactly.

Every number below is worked out by hand from the timeline (arrival, duration in seconds).
"""

from __future__ import annotations

import pytest

from omni_runtime.bench.playback import Chunk, Playback, play, summarize_speech
from omni_runtime.bench.stats import RequestSample, summarize


def _t(*pairs: tuple[float, float]) -> list[Chunk]:
    return [Chunk(arrival, duration) for arrival, duration in pairs]


@pytest.mark.parametrize(
    ("timeline", "expected"),
    [
        # ahead of playback all along: chunk 2 arrives at 1.5, playback needs it at 2.5
        (
            _t((0.5, 2.0), (1.5, 2.0), (2.0, 1.0)),
            Playback(ttfa_s=0.5, audio_s=5.0, stall_s=0.0, stalls=0, finish_s=5.5, rtf=0.4, min_slack_s=1.0),
        ),
        # exactly on time: each chunk arrives the moment the previous one ends (no stall)
        (
            _t((1.0, 1.0), (2.0, 1.0), (3.0, 1.0)),
            Playback(ttfa_s=1.0, audio_s=3.0, stall_s=0.0, stalls=0, finish_s=4.0, rtf=1.0, min_slack_s=0.0),
        ),
        # slower than real time: 1 s chunks every 2 s -> two 1 s stalls
        (
            _t((1.0, 1.0), (3.0, 1.0), (5.0, 1.0)),
            Playback(
                ttfa_s=1.0, audio_s=3.0, stall_s=2.0, stalls=2, finish_s=6.0, rtf=5 / 3, min_slack_s=-1.0
            ),
        ),
        # a stall, then a burst that refills the buffer, then on time: 0.5 s stall only
        (
            _t((0.0, 1.0), (1.5, 1.0), (1.6, 3.0), (5.0, 0.5)),
            Playback(
                ttfa_s=0.0, audio_s=5.5, stall_s=0.5, stalls=1, finish_s=6.0, rtf=5.0 / 5.5, min_slack_s=-0.5
            ),
        ),
        # arrival order, not list order; empty chunks are ignored
        (
            _t((2.0, 1.0), (0.5, 1.0), (1.0, 0.0)),
            Playback(ttfa_s=0.5, audio_s=2.0, stall_s=0.5, stalls=1, finish_s=3.0, rtf=1.0, min_slack_s=-0.5),
        ),
        # one chunk with all the audio (the HF generate baseline): never stalls, rtf = latency / audio
        (
            _t((4.0, 8.0)),
            Playback(ttfa_s=4.0, audio_s=8.0, stall_s=0.0, stalls=0, finish_s=12.0, rtf=0.5),
        ),
    ],
)
def test_play(timeline: list[Chunk], expected: Playback) -> None:
    assert play(timeline) == pytest.approx(expected)  # type: ignore[arg-type]


def test_play_rejects_negative_arrivals_and_returns_none_without_audio() -> None:
    assert play([]) is None
    assert play(_t((1.0, 0.0))) is None
    with pytest.raises(ValueError, match="negative"):
        play(_t((-0.1, 1.0)))


def test_real_time_tolerates_float_sums_only() -> None:
    # 0.1 s chunks summed: 0.1 * 3 != 0.3 in floats, still on time
    on_time = play(_t((0.0, 0.1), (0.1, 0.1), (0.2, 0.1), (0.30000000000000004, 0.1)))
    assert on_time is not None and on_time.real_time and on_time.stalls == 0
    late = play(_t((0.0, 0.1), (0.101, 0.1)))
    assert late is not None and not late.real_time and late.stall_s == pytest.approx(0.001)


def test_summarize_speech_level_exact() -> None:
    timelines = [
        _t((0.5, 2.0), (1.5, 2.0), (2.0, 1.0)),  # ttfa 0.5, stall 0, rtf 0.4, 5 s
        _t((1.0, 1.0), (3.0, 1.0), (5.0, 1.0)),  # ttfa 1.0, stall 2, rtf 5/3, 3 s
        _t((0.0, 1.0), (1.5, 1.0), (1.6, 3.0), (5.0, 0.5)),  # ttfa 0.0, stall 0.5, rtf 10/11, 5.5 s
        [],  # a stream that got no audio is not counted
    ]
    level = summarize_speech(timelines, wall_s=4.0)
    assert level.audio_streams == 3
    assert level.realtime_streams == 1
    assert level.ttfa_p50_s == 0.5
    assert level.ttfa_p95_s == pytest.approx(0.95)  # 0.5 + 0.9 * (1.0 - 0.5)
    assert level.ttfa_p99_s == pytest.approx(0.99)
    assert level.stall_mean_s == pytest.approx(2.5 / 3)
    assert level.stall_p95_s == pytest.approx(1.85)  # 0.5 + 0.9 * 1.5
    assert level.stall_max_s == 2.0
    assert level.rtf_p50 == pytest.approx(10 / 11)
    assert level.rtf_max == pytest.approx(5 / 3)
    assert level.audio_s == 13.5
    assert level.audio_s_per_s == 13.5 / 4.0
    assert (level.stream_audio_min_s, level.stream_audio_p50_s) == (3.0, 5.0)  # streams of 5, 3, 5.5 s
    assert level.closest_s == pytest.approx(-1.0)  # closest calls 1.0, -1.0 and -0.5 s


def test_summarize_speech_without_audio() -> None:
    level = summarize_speech([[], []], wall_s=2.0)
    assert (level.audio_streams, level.realtime_streams, level.ttfa_p50_s, level.stall_max_s) == (
        0,
        0,
        None,
        None,
    )
    assert level.audio_s_per_s == 0.0


def test_level_summary_carries_the_listener_numbers() -> None:
    samples = [
        RequestSample(ok=True, latency_s=2.0, ttfa_s=0.5, audio=tuple(_t((0.5, 2.0), (2.0, 1.0)))),
        RequestSample(
            ok=True, latency_s=6.0, ttfa_s=1.0, audio=tuple(_t((1.0, 1.0), (3.0, 1.0), (5.0, 1.0)))
        ),
        RequestSample(ok=False, latency_s=0.1, error="HTTP 429: full", status=429),
        RequestSample(ok=False, latency_s=0.1, error="HTTP 500: boom", status=500),
    ]
    row = summarize(samples, concurrency=2, wall_s=6.0, rate_per_s=0.5)
    assert (row.audio_streams, row.realtime_streams, row.failed, row.refused) == (2, 1, 2, 1)
    assert row.stall_mean_s == 1.0 and row.stall_max_s == 2.0
    assert row.closest_s == pytest.approx(-1.0)  # 0.5 s left for the first stream, a 1 s wait for the second
    assert row.audio_s_per_s == 1.0
    assert (row.stream_audio_min_s, row.stream_audio_p50_s) == (3.0, 3.0)
    assert row.rtf_p50 == pytest.approx((2 / 3 + 5 / 3) / 2)
    assert row.load == "0.5/s"
    # the row survives a JSON round trip (a baseline file)
    assert type(row).from_json(row.to_json()) == row


def test_text_level_has_no_listener_numbers() -> None:
    row = summarize([RequestSample(ok=True, latency_s=1.0, ttft_s=0.1)], concurrency=1, wall_s=1.0)
    assert (row.audio_streams, row.stall_mean_s, row.rate_per_s, row.load) == (None, None, None, "1")
