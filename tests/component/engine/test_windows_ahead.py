"""A streaming reply's next window goes to the vocoder while the one before is still there.

With one window at a time, a reply's second window was asked only once its first came back; under
load that round trip outlasted the first window's audio and the listener stalled. The engine now
keeps up to ``windows_ahead`` of a reply's windows at the vocoder: the audio must be the same, in
the same order, and the second window must really be asked before the first returns.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from engine_harness import Harness, finished, request

from omni_runtime.contract.engine import AudioChunk


def _speak(harness: Harness, *, ahead: int) -> tuple[np.ndarray, int, list[float | None]]:
    """One seeded streaming reply with planned windows (no catch-up: the cut does not depend on
    timing); returns its audio, the most windows it had at the vocoder at once, and each
    window's slack as the engine computed it."""
    engine: Any = harness.engine
    stages = engine.stages
    synthesize = stages.synthesize
    windows = dict(engine.adapter.codec_windows)
    engine.adapter.codec_windows = {**windows, "catch_up": False}
    engine.windows_ahead = ahead
    in_flight = 0
    most = 0
    slacks: list[float | None] = []
    second_asked: asyncio.Event | None = None

    async def observed(item: dict[str, Any]) -> Any:
        nonlocal in_flight, most
        assert second_asked is not None
        in_flight += 1
        most = max(most, in_flight)
        slacks.append(item["slack_s"])
        try:
            if len(slacks) == 1 and ahead > 1:
                # The first window waits until the second is asked: so the case happens whatever the
                # CPU's timing (the talker keeps going meanwhile, so its codes come).
                await asyncio.wait_for(second_asked.wait(), 120)
            elif len(slacks) == 2:
                second_asked.set()
            return await synthesize(item)
        finally:
            in_flight -= 1

    async def scenario() -> list[Any]:
        nonlocal second_asked
        second_asked = asyncio.Event()
        req = request("Say something", max_tokens=12, want_audio=True, talker_tokens=90, seed=7)
        assert req.stream_audio
        return [event async for event in engine.generate(req)]

    stages.synthesize = observed
    try:
        events = harness.run(scenario())
    finally:
        del stages.synthesize
        engine.adapter.codec_windows = windows
        engine.windows_ahead = 2
    assert finished(events).reason == "length"
    chunks = [e.pcm for e in events if isinstance(e, AudioChunk)]
    assert len(chunks) >= 3, [c.size for c in chunks]
    return np.concatenate(chunks), most, slacks


def test_windows_ahead_give_the_same_audio_sooner(family_speech_engine: Harness) -> None:
    one_at_a_time, most_one, slacks_one = _speak(family_speech_engine, ahead=1)
    ahead, most_two, slacks_two = _speak(family_speech_engine, ahead=2)
    assert most_one == 1
    assert most_two == 2
    assert ahead.shape == one_at_a_time.shape
    np.testing.assert_allclose(ahead, one_at_a_time, atol=1e-4)
    # The first window is a first window either way; the second, asked while the first was still at
    # the vocoder, carries the slack of the first's audio (deadlines.ahead_slack), not None.
    assert slacks_one[0] is None and slacks_two[0] is None
    assert slacks_two[1] is not None and slacks_two[1] > 0


def test_the_vocoders_worker_reads_the_engines_play_heads(speech_engine: Harness) -> None:
    """``OMNI_VOCODER_FAR=...,near`` bounds far windows' calls only while a stream is near: the
    vocoder's worker asks the engine (`Engine.streams_near`). A reply is near before its first audio
    at any threshold, then near below its listener's slack, and no reply is near once it ended."""
    engine: Any = speech_engine.engine
    stages = engine.stages
    worker = getattr(stages, "local", stages).vocoder_worker
    assert worker.near == engine.streams_near
    synthesize = stages.synthesize
    seen: list[tuple[bool, bool]] = []  # (near within 1e9 s, near within -1e9 s) at each window

    async def observed(item: dict[str, Any]) -> Any:
        seen.append((engine.streams_near(1e9), engine.streams_near(-1e9)))
        return await synthesize(item)

    stages.synthesize = observed
    try:
        req = request("Say something", max_tokens=12, want_audio=True, talker_tokens=90, seed=7)
        events = speech_engine.collect(req)
    finally:
        del stages.synthesize
    assert finished(events).reason == "length"
    assert len(seen) >= 3
    assert seen[0] == (True, True)  # before its first audio: near at any threshold
    assert (True, False) in seen[1:]  # after it: near only below its slack
    assert not engine.streams_near(1e9)  # ended: no play head left
