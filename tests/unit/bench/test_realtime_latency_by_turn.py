"""The realtime latency probe's per-turn-index rows (turn 1 vs turn N), as an exact table."""

from __future__ import annotations

from omni_runtime.bench.realtime_latency import TurnSample, by_turn


def test_rows_group_samples_by_turn_index_across_sessions() -> None:
    sessions = [
        [TurnSample(0.5, 100, 0), TurnSample(0.2, 160, 120), TurnSample(0.3, 220, 180)],
        [TurnSample(0.7, 100, 0), TurnSample(0.4, 170, 130)],  # this session stopped after 2 turns
        [TurnSample(None, 100, 0)],  # a reply without audio: counted, not timed
    ]
    assert by_turn(sessions) == [
        {
            "turn_index": 1,
            "samples": 3,
            "no_audio": 1,
            "median_s": 0.6,
            "p90_s": 0.68,  # linear between 0.5 and 0.7 (bench.quantile)
            "p95_s": 0.69,
            "max_s": 0.7,
            "input_tokens": 100,
            "cached_tokens": 0,
            "created_s": None,
            "first_text_s": None,
        },
        {
            "turn_index": 2,
            "samples": 2,
            "no_audio": 0,
            "median_s": 0.3,
            "p90_s": 0.38,
            "p95_s": 0.39,
            "max_s": 0.4,
            "input_tokens": 165,
            "cached_tokens": 125,
            "created_s": None,
            "first_text_s": None,
        },
        {
            "turn_index": 3,
            "samples": 1,
            "no_audio": 0,
            "median_s": 0.3,
            "p90_s": 0.3,
            "p95_s": 0.3,
            "max_s": 0.3,
            "input_tokens": 220,
            "cached_tokens": 180,
            "created_s": None,
            "first_text_s": None,
        },
    ]
    assert by_turn([]) == []
    assert by_turn([[TurnSample(None, 9, 0)]])[0] == {
        "turn_index": 1,
        "samples": 1,
        "no_audio": 1,
        "median_s": None,
        "p90_s": None,
        "p95_s": None,
        "max_s": None,
        "input_tokens": 9,
        "cached_tokens": 0,
        "created_s": None,
        "first_text_s": None,
    }


def test_rows_carry_the_median_of_each_phase() -> None:
    """When response.created and the first text came, per turn index (medians over the turns that
    have the mark; a reply with no audio still has its created and text marks)."""
    sessions = [
        [TurnSample(0.5, 100, 0, created_s=0.01, first_text_s=0.20)],
        [TurnSample(0.7, 100, 0, created_s=0.03, first_text_s=0.30)],
        [TurnSample(None, 100, 0, created_s=0.02, first_text_s=None)],
    ]
    (row,) = by_turn(sessions)
    assert (row["created_s"], row["first_text_s"], row["median_s"]) == (0.02, 0.25, 0.6)


def test_levels_run_in_several_rounds_are_pooled() -> None:
    from omni_runtime.bench.realtime_latency import pooled

    rounds = [
        {"concurrency": 1, "latencies_s": [0.3, 0.2]},
        {"concurrency": 8, "latencies_s": [0.4, 0.5, None]},
        {"concurrency": 8, "latencies_s": [0.6, 0.45]},
        {"concurrency": 8, "latencies_s": [0.55]},
    ]
    (line,) = pooled(rounds)  # one round of 1: nothing to pool
    assert line == {
        "pooled": True,
        "concurrency": 8,
        "rounds": 3,
        "samples": 6,
        "no_audio": 1,
        "median_s": 0.5,
        "p90_s": 0.58,
        "p95_s": 0.59,
        "max_s": 0.6,
    }
