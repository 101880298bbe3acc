"""When the speech of the turn being spoken is sent to be encoded, chunk by chunk (exact table)."""

from __future__ import annotations

import pytest

from omni_runtime.realtime.session.input_audio import EarlyEncoding


@pytest.mark.parametrize(
    ("start", "totals", "due"),
    [
        # 2 s chunks at 16 kHz, 50 ms margin: due once start + k*32000 + 800 samples exist
        (0, [10_000, 32_799, 32_800, 40_000, 64_800, 200_000], [None, None, 32_800, None, 64_800, 192_800]),
        # a turn that starts later (server VAD's speech start): counted from there
        (5_000, [37_799, 37_800, 70_000], [None, 37_800, 69_800]),
    ],
)
def test_due_after_each_whole_chunk(start: int, totals: list[int], due: list[int | None]) -> None:
    early = EarlyEncoding(32_000)
    early.begin(start)
    assert [early.due(total) for total in totals] == due


def test_nothing_is_due_without_chunks_or_before_a_turn_begins() -> None:
    assert EarlyEncoding(None).due(10**6) is None
    early = EarlyEncoding(32_000)
    assert early.due(10**6) is None  # no turn begun
    early.begin(0)
    assert early.due(40_000) == 32_800
    early.reset()  # committed or cleared
    assert early.due(80_000) is None
    early.begin(40_000)  # the next turn counts its own chunks from its own start
    assert early.due(72_799) is None
    assert early.due(80_000) == 72_800
    assert early.due(80_000) is None  # each chunk once
