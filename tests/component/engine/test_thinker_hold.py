"""The thinker pauses while a first audio window is synthesised on the device it shares.

A streaming speech reply's first window is the time to first audio; on a shared GPU it ran twice
as long behind the thinker's decode steps, so the engine holds the thinker for that window only.
"""

from __future__ import annotations

import asyncio
from typing import Any

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
        async with thinker.hold():
            await asyncio.sleep(0.05)  # the step in flight when the hold began may still land
            paused_at = thinker.steps
            await asyncio.sleep(0.3)
            still = thinker.steps
        await asyncio.wait_for(task, 120)
        return paused_at, still, events

    paused_at, still, events = speech_engine.run(scenario())
    assert still == paused_at
    assert finished(events).reason == "length"
    assert len(token_ids(events)) == 60


def test_streaming_speech_holds_the_thinker_for_the_first_window_only(speech_engine: Harness) -> None:
    engine: Any = speech_engine.engine
    # Only a shared GPU turns the hold on; the policy itself is the same on the CPU.
    assert not engine.adapter.vocoder_shares_thinker_device
    assert not engine.hold_thinker_for_first_window
    engine.hold_thinker_for_first_window = True
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
        engine.hold_thinker_for_first_window = False
    chunks = [e for e in events if isinstance(e, AudioChunk)]
    assert len(chunks) >= 2  # a first window and later ones
    assert len(entered) == 1
    assert finished(events).reason == "length"
