"""A streaming speech reply's way to first audio, split into the engine's phases (exact)."""

from __future__ import annotations

from omni_runtime.contract.engine import FIRST_AUDIO_PHASES
from omni_runtime.pipeline.engine import FirstAudioMarks
from omni_runtime.pipeline.workers import TimeCounts


def test_each_phase_runs_from_the_previous_mark_and_they_add_up_to_first_audio() -> None:
    marks = FirstAudioMarks(
        accepted=10.0, submitted=10.02, first_token=10.1, first_code=10.15, window_asked=10.4
    )
    phases = TimeCounts()
    marks.record(phases, audio=10.47)
    got = {h.kind: (h.count, round(h.sum_s, 6)) for h in phases.snapshot()}
    assert got == {
        "prompt": (1, 0.02),
        "first_token": (1, 0.08),
        "talker_first_code": (1, 0.05),
        "first_window_codes": (1, 0.25),
        "first_window": (1, 0.07),
    }
    assert set(got) == set(FIRST_AUDIO_PHASES)
    assert round(sum(s for _, s in got.values()), 6) == 0.47


def test_a_reply_that_skipped_a_step_is_not_split() -> None:
    phases = TimeCounts()
    FirstAudioMarks(accepted=1.0, submitted=1.1, first_token=1.2).record(phases, audio=1.9)
    assert phases.snapshot() == ()
