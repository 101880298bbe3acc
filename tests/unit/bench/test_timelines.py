"""`bench.timelines`: a speech run's timelines by chunk number, worked out by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from omni_runtime.bench.playback import Chunk, chunk_waits, play
from omni_runtime.bench.timelines import ChunkRow, by_chunk, main

# Two streams of one level. A: 0.4 s first at 0.5, so it runs dry at 0.9; the second chunk comes at
# 1.0 (a 0.1 s wait; now playing until 1.2), the third at 1.1 (0.1 s left; until 1.7), the fourth at
# 1.5 (0.2 s left). B is always ahead: 0.3, 0.4 and 0.5 s left.
A = [[0.5, 0.4], [1.0, 0.2], [1.1, 0.5], [1.5, 0.2]]
B = [[0.3, 0.4], [0.4, 0.2], [0.5, 0.2], [0.6, 0.3]]


def test_each_chunk_has_the_audio_still_queued_when_it_came_and_the_wait_it_ended() -> None:
    heard = chunk_waits([Chunk(a, s) for a, s in A])
    assert [slack for slack, _ in heard] == pytest.approx([-0.1, 0.1, 0.2])
    assert [wait for _, wait in heard] == pytest.approx([0.1, 0.0, 0.0])
    assert [slack for slack, _ in chunk_waits([Chunk(a, s) for a, s in B])] == pytest.approx([0.3, 0.4, 0.5])
    assert chunk_waits([Chunk(0.2, 1.0)]) == []
    assert chunk_waits([]) == []


def test_a_chunk_late_by_float_noise_is_no_stall_in_either_count() -> None:
    """1 ns past the play head rounds as the bench's stall rule always did (EPSILON_S): no wait."""
    timeline = [Chunk(0.0, 1.0), Chunk(1.0 + 1e-9, 0.5)]
    heard = play(timeline)
    assert heard is not None and (heard.stall_s, heard.stalls, heard.real_time) == (0.0, 0, True)
    assert [wait for _, wait in chunk_waits(timeline)] == [0.0]


def test_rows_by_level_and_chunk_number_pool_the_chunks_past_the_last_shown() -> None:
    rows = [
        {"level": "c=2", "chunks": A},
        {"level": "c=2", "chunks": B},
        {"level": "c=2", "chunks": None},  # a text reply or a failed request: no timeline
        {"level": "2/s", "chunks": [[0.2, 0.2], [0.5, 0.2]]},  # 0.1 s late
    ]
    got = by_chunk(rows, chunks=3)
    want = [
        ChunkRow("c=2", "2", streams=2, stalled=1, stall_s=0.1, slack_min_s=-0.1, slack_p50_s=0.1),
        ChunkRow("c=2", "3", streams=2, stalled=0, stall_s=0.0, slack_min_s=0.1, slack_p50_s=0.25),
        ChunkRow("c=2", "4+", streams=2, stalled=0, stall_s=0.0, slack_min_s=0.2, slack_p50_s=0.35),
        ChunkRow("2/s", "2", streams=1, stalled=1, stall_s=0.1, slack_min_s=-0.1, slack_p50_s=-0.1),
    ]
    assert [(r.level, r.chunk, r.streams, r.stalled) for r in got] == [
        (r.level, r.chunk, r.streams, r.stalled) for r in want
    ]
    for row, expected in zip(got, want, strict=True):
        assert (row.stall_s, row.slack_min_s, row.slack_p50_s) == pytest.approx(
            (expected.stall_s, expected.slack_min_s, expected.slack_p50_s)
        )


def test_at_least_the_second_chunk_is_shown() -> None:
    with pytest.raises(ValueError, match=r"^chunks is 1: show at least the second chunk"):
        by_chunk([], chunks=1)


def test_the_command_prints_the_table_of_a_requests_file(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(json.dumps({"level": "c=2", "chunks": c}) for c in (A, B)) + "\n")
    assert main([str(path), "--chunks", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "level",
        "chunk",
        "streams",
        "stalled",
        "stall",
        "s",
        "slack",
        "min",
        "slack",
        "p50",
    ]
    assert lines[2].split() == ["c=2", "2", "2", "1", "0.100", "-0.100", "+0.100"]
    assert lines[3].split() == ["c=2", "3+", "4", "0", "0.000", "+0.100", "+0.300"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json\n", r"requests.jsonl:1: not JSON \(.*\); expected omni bench's requests.jsonl"),
        ('{"level": "c=1"}\n[1, 2]\n', r"requests.jsonl:2: a JSON list, not a request row"),
        ('{"level": "c=1", "chunks": null}\n', r"has no speech stream with two or more audio chunks"),
        ('{"level": "c=1", "chunks": [[0.1, 0.2]]}\n', r"has no speech stream with two or more audio chunks"),
        ('{"level": "c=1", "chunks": [1, 2]}\n', r"requests.jsonl:1: chunks must be a list of \[arrival"),
        ('{"chunks": [[0.1, null]]}\n', r"requests.jsonl:1: chunks must be a list of \[arrival"),
        ('{"chunks": "ab"}\n', r"requests.jsonl:1: chunks must be a list of \[arrival"),
        ('{"chunks": [[0.1, 0.2, 0.3]]}\n', r"requests.jsonl:1: chunks must be a list of \[arrival"),
    ],
)
def test_a_file_that_is_not_a_speech_run_is_named_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture, text: str, message: str
) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text(text)
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and re.search(message, err)


def test_a_missing_file_is_an_error_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(tmp_path / "absent.jsonl")]) == 2
    assert "absent.jsonl" in capsys.readouterr().err
