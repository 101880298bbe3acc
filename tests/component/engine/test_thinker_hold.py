"""The thinker pauses while a first audio window is synthesised on the device it shares.

A streaming speech reply's first window is the time to first audio; on a shared GPU it ran twice
as long behind the thinker's decode steps, so the engine holds the thinker for that window, and for
a later one whose listener is about to run dry (``thinker_hold_below_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
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
            # Seeded: an unseeded random-weight talker may draw its end code before a second window.
            request("Say something", max_tokens=12, want_audio=True, talker_tokens=60, seed=7)
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


def test_no_later_window_holds_the_thinker_while_another_reply_waits_for_its_first_audio(
    speech_engine: Harness,
) -> None:
    """Two streaming replies, the second sent once the first has audio: while the second has none,
    the first's later windows leave the thinker running (its text is the second's first codes);
    every window holds once both have audio (every listener is "about to run dry" here).

    The second's first window waits until the first has cut a later window, so the case under
    test happens in every run, not only when the CPU's timing gives it."""
    engine: Any = speech_engine.engine
    engine.thinker_hold_below_s = 1e9
    thinker = engine.stages.thinker
    # (later window, replies before first audio, another reply's talker on text, held)
    decided: list[tuple[bool, int, bool, bool]] = []
    window_hold = engine._window_hold
    one_req = _streaming(talker_tokens=200, seed=7)  # seeded: no early end code from random weights
    two_req = _streaming(talker_tokens=60, seed=11)
    later_while_waiting: asyncio.Event | None = None  # made inside the harness's loop

    @contextlib.asynccontextmanager
    async def after_a_later_window_of_the_first(hold: Any) -> Any:
        assert later_while_waiting is not None
        await asyncio.wait_for(later_while_waiting.wait(), 120)
        async with hold:
            yield

    def recording_hold(slack_s: float | None, request_id: str) -> Any:
        pending = len(engine._before_first_audio - {request_id}) + thinker.waiting_count
        text = bool(engine._talkers_on_text - {request_id})
        hold = window_hold(slack_s, request_id)
        decided.append((slack_s is not None, pending, text, not isinstance(hold, contextlib.nullcontext)))
        assert later_while_waiting is not None
        if request_id == one_req.request_id and slack_s is not None and pending > 0:
            later_while_waiting.set()
        if request_id == two_req.request_id and slack_s is None:
            return after_a_later_window_of_the_first(hold)
        return hold

    engine._window_hold = recording_hold

    async def scenario() -> tuple[list, list]:
        nonlocal later_while_waiting
        later_while_waiting = asyncio.Event()
        first: list = []
        second: list = []

        async def consume(req: Any, into: list) -> None:
            async for event in engine.generate(req):
                into.append(event)

        one = asyncio.create_task(consume(one_req, first))
        while not any(isinstance(e, AudioChunk) for e in first):
            await asyncio.sleep(0.005)
        two = asyncio.create_task(consume(two_req, second))
        await asyncio.wait_for(asyncio.gather(one, two), 300)
        return first, second

    try:
        first, second = speech_engine.run(scenario())
    finally:
        del engine._window_hold
        engine.thinker_hold_below_s = None
    assert finished(first).reason == finished(second).reason == "length"
    # the first's later windows while the second waited for audio: none held the thinker
    waited = [held for later, pending, _, held in decided if later and pending > 0]
    assert waited and not any(waited), decided
    # otherwise a window holds unless it is a later one while another reply's talker takes text
    assert all(held == (not later or not text) for later, pending, text, held in decided if pending == 0), (
        decided
    )
    assert not engine._before_first_audio  # every reply reached its audio: nothing counted left
    assert not engine._talkers_on_text  # and every reply's text ended


def test_a_later_window_spares_the_text_another_reply_s_talker_waits_for(speech_engine: Harness) -> None:
    """While another reply's talker still takes the thinker's text, a later window does not pause
    the thinker (it would pause that reply's codes); a reply's own text does not count, and a
    first window holds either way."""
    engine: Any = speech_engine.engine
    engine.thinker_hold_below_s = 1e9  # every listener is "about to run dry"
    assert not engine._before_first_audio and engine.stages.thinker.waiting_count == 0

    def holds(slack_s: float | None, own: str, on_text: set[str], spare: bool = True) -> bool:
        engine._talkers_on_text, engine.holds_spare_text = set(on_text), spare
        return not isinstance(engine._window_hold(slack_s, own), contextlib.nullcontext)

    try:
        assert holds(0.1, "a", set())  # nobody waits on text
        assert holds(0.1, "a", {"a"})  # only its own reply: its codes wait anyway
        assert not holds(0.1, "a", {"a", "b"})  # b's talker would stop too
        assert not holds(-0.5, "a", {"b"})  # even a stalled listener
        assert holds(None, "a", {"b"})  # a first window: the time to first audio
        assert holds(0.1, "a", {"b"}, spare=False)  # the rule before (profile_speech's baseline)
    finally:
        engine._talkers_on_text, engine.holds_spare_text = set(), True
        engine.thinker_hold_below_s = None


def test_a_reply_cancelled_before_its_first_audio_is_no_longer_waited_for(speech_engine: Harness) -> None:
    engine: Any = speech_engine.engine

    async def scenario() -> None:
        stream = engine.generate(_streaming(talker_tokens=200))
        async for event in stream:
            if isinstance(event, TextDelta):  # the talker has its job; no audio yet
                break
        await stream.aclose()  # the client leaves
        while not engine.stages.local.quiet:
            await asyncio.sleep(0.01)

    speech_engine.run(scenario())
    assert not engine._before_first_audio
    assert not engine._talkers_on_text  # its text will never end: it was let go with the reply


def _streaming(*, talker_tokens: int, seed: int | None = None) -> Any:
    req = request("Say something", max_tokens=24, want_audio=True, talker_tokens=talker_tokens, seed=seed)
    assert req.stream_audio  # audio windows as the codes come (the streaming-speech engine)
    return req


def test_first_audio_splits_into_the_engine_s_phases(speech_engine: Harness) -> None:
    """One streaming reply adds one duration to each FIRST_AUDIO_PHASES histogram, and they add up
    to no more than the time to first audio the caller saw."""
    import time

    from omni_runtime.contract.engine import FIRST_AUDIO_PHASES

    engine: Any = speech_engine.engine

    def sums() -> dict[str, tuple[int, float]]:
        return {h.kind: (h.count, h.sum_s) for h in engine.stats().first_audio_phases}

    before = sums()

    async def first_audio() -> tuple[float, list]:
        began, seen, events = time.monotonic(), None, []
        async for event in engine.generate(_streaming(talker_tokens=60)):
            if isinstance(event, AudioChunk) and seen is None:
                seen = time.monotonic() - began
            events.append(event)
        assert seen is not None
        return seen, events

    ttfa, events = speech_engine.run(first_audio())
    after = sums()
    assert finished(events).reason == "length"
    added = {phase: after[phase][1] - before.get(phase, (0, 0.0))[1] for phase in FIRST_AUDIO_PHASES}
    assert all(after[phase][0] - before.get(phase, (0, 0.0))[0] == 1 for phase in FIRST_AUDIO_PHASES)
    assert all(seconds >= 0 for seconds in added.values()), added
    assert 0 < sum(added.values()) <= ttfa, (added, ttfa)
