"""The thinker pauses while a first audio window is synthesised on the device it shares.

A streaming speech reply's first window is the time to first audio; on a shared GPU it ran twice
as long behind the thinker's decode steps, so the engine holds the thinker for that window, and for
a later one whose listener is about to run dry (``thinker_hold_below_s``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from engine_harness import Harness, finished, request, token_ids

from omni_runtime.contract.engine import AudioChunk, TextDelta


def test_a_hold_stops_decode_steps_until_released(speech_engine: Harness) -> None:
    engine: Any = speech_engine.engine
    thinker = engine.stages.thinker

    async def scenario() -> tuple[int, int, list]:
        events: list = []

        async def consume() -> None:
            async for event in engine.generate(request("Count slowly", max_tokens=60)):
                events.append(event)

        task = asyncio.create_task(consume())
        while not any(isinstance(e, TextDelta) for e in events):
            await asyncio.sleep(0.005)
        held_before = thinker.held_s
        async with thinker.hold():
            await asyncio.sleep(0.05)  # the step in flight when the hold began may still land
            paused_at = thinker.steps
            await asyncio.sleep(0.3)
            still = thinker.steps
            assert thinker.held_s == held_before  # counted when the hold ends
        assert thinker.held_s - held_before >= 0.35
        await asyncio.wait_for(task, 120)
        return paused_at, still, events

    paused_at, still, events = speech_engine.run(scenario())
    assert still == paused_at
    assert finished(events).reason == "length"
    assert len(token_ids(events)) == 60


@pytest.mark.parametrize(
    ("below_s", "holding"),
    [
        (float("-inf"), "first"),  # the first window only
        (1e9, "all"),  # every listener is "about to run dry": every window holds
    ],
)
def test_streaming_speech_holds_the_thinker_for_the_windows_its_setting_names(
    speech_engine: Harness, below_s: float, holding: str
) -> None:
    engine: Any = speech_engine.engine
    # Only a shared GPU turns the hold on; the policy itself is the same on the CPU.
    assert not engine.adapter.vocoder_shares_thinker_device
    assert engine.thinker_hold_below_s is None
    engine.thinker_hold_below_s = below_s
    thinker = engine.stages.thinker
    original = thinker.hold
    entered: list[int] = []

    def counting_hold():
        entered.append(thinker.steps)
        return original()

    thinker.hold = counting_hold
    try:
        events = speech_engine.collect(
            request("Say something", max_tokens=12, want_audio=True, talker_tokens=60)
        )
    finally:
        del thinker.hold
        engine.thinker_hold_below_s = None
    chunks = [e for e in events if isinstance(e, AudioChunk)]
    assert len(chunks) >= 2  # a first window and later ones
    assert len(entered) == (1 if holding == "first" else len(chunks)), (
        f"holds entered at thinker steps {entered}; chunks of {[c.pcm.size for c in chunks]} samples"
    )
    assert finished(events).reason == "length"
