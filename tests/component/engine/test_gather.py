"""OMNI_GATHER_MS on the real tiny engine: an idle thinker holds a burst's first prompts while the
rest are still in their prompt phase, so the burst is one prefill; without it the same burst is
admitted as the prompts arrive. Counted by the scheduler (its admissions), not timed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from engine_harness import Harness, finished, request, tiny_options


def _burst(harness: Harness, size: int) -> int:
    """Admissions (prefills) the thinker took for ``size`` requests sent at once."""
    scheduler = harness.engine.stages.thinker
    before = scheduler.admissions

    async def many() -> list[list]:
        async def one(i: int) -> list:
            return [e async for e in harness.engine.generate(request(f"Question {i}?", max_tokens=4))]

        return await asyncio.gather(*(one(i) for i in range(size)))

    results = harness.run(many())
    assert all(finished(events).reason == "length" for events in results)
    return scheduler.admissions - before


def test_a_burst_is_one_prefill_with_a_hold(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNI_GATHER_MS", "1000")  # far longer than the tiny prompts take on a CPU
    harness = Harness(tiny_options(tiny_checkpoint))
    try:
        assert harness.engine.stages.thinker.gather_s == 1.0
        for size in (4, 6):
            assert _burst(harness, size) == 1
        assert harness.engine.stages.local.prompting == 0  # every prompt phase counted out again
        assert _burst(harness, 1) == 1  # a lone request is not held: nothing else is coming
    finally:
        harness.close()


def test_without_the_switch_nothing_is_held(speech_engine: Harness) -> None:
    """The first prompt is admitted alone: the thinker takes it the moment it is submitted, while the
    preprocessing thread still has the other three (2 admissions in five runs here)."""
    assert speech_engine.engine.stages.thinker.gather_s == 0.0
    assert _burst(speech_engine, 4) >= 2
