"""The cancel probe's arithmetic: per-stage counter gains read from two /metrics expositions."""

from __future__ import annotations

import pytest

from omni_runtime.bench.cancel_tail import stage_counters, tail_report

BEFORE = """\
# HELP omni_stage_busy_seconds_total Wall time.
omni_stage_busy_seconds_total{stage="thinker"} 10.0
omni_stage_busy_seconds_total{stage="talker"} 4.5
omni_stage_busy_seconds_total{stage="vocoder"} 7.25
omni_stage_busy_after_cancel_seconds_total{stage="vocoder"} 0.5
omni_stage_cancelled_total{stage="talker"} 2.0
omni_stage_items_total{stage="vocoder"} 40.0
"""


def test_stage_counters_reads_one_family_by_stage() -> None:
    assert stage_counters(BEFORE, "omni_stage_busy_seconds_total") == {
        "thinker": 10.0,
        "talker": 4.5,
        "vocoder": 7.25,
    }
    assert stage_counters(BEFORE, "omni_stage_busy_after_cancel_seconds_total") == {"vocoder": 0.5}
    assert stage_counters(BEFORE, "omni_stage_missing_total") == {}


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        (BEFORE, {}),  # nothing ran after the cancel
        (
            BEFORE.replace('"vocoder"} 7.25', '"vocoder"} 7.5')
            .replace(
                'after_cancel_seconds_total{stage="vocoder"} 0.5',
                'after_cancel_seconds_total{stage="vocoder"} 0.75',
            )
            .replace('cancelled_total{stage="talker"} 2.0', 'cancelled_total{stage="talker"} 3.0'),
            {
                "talker": {"busy_s": 0.0, "busy_after_cancel_s": 0.0, "cancelled": 1.0},
                "vocoder": {"busy_s": 0.25, "busy_after_cancel_s": 0.25, "cancelled": 0.0},
            },
        ),
        (  # a stage that first appears after the cancel counts from zero
            BEFORE + 'omni_stage_cancelled_total{stage="vocoder"} 3.0\n',
            {"vocoder": {"busy_s": 0.0, "busy_after_cancel_s": 0.0, "cancelled": 3.0}},
        ),
    ],
)
def test_tail_report_is_what_each_stage_gained(after: str, expected: dict) -> None:
    assert tail_report(BEFORE, after) == expected
