"""Cancel all the way down (issue 20): closing a speech stream stops the thinker and talker rows at
their next step and drops the vocoder windows not yet running, observed through the engine's own
counters (``StageLoad.cancelled``, items launched), never through timing; the next request works.
Non-streaming speech is vocoded in the streaming windows, so it is cancellable and keeps its length."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
from engine_harness import Harness, finished, request

from omni_runtime.contract.engine import AudioChunk, GenerationRequest

SETTLE_TIMEOUT_S = 60.0
ATTEMPTS = 5  # replies tried until one is still speaking when its talker is held


@dataclass(frozen=True)
class Snapshot:
    thinker_cancelled: int
    talker_cancelled: int
    thinker_rows: int
    talker_rows: int
    vocoder_items: int
    vocoder_dropped: int
    thinker_active: int
    talker_active: int


def _snapshot(engine: Any) -> Snapshot:
    local = engine.stages.local
    return Snapshot(
        thinker_cancelled=local.thinker.cancelled,
        talker_cancelled=local.talker.cancelled,
        thinker_rows=local.thinker.rows_stepped,
        talker_rows=local.talker.rows_stepped,
        vocoder_items=local.vocoder_worker.items,
        vocoder_dropped=local.vocoder_worker.dropped,
        thinker_active=local.thinker.active,
        talker_active=local.talker.active,
    )


async def _settled(engine: Any) -> Snapshot:
    """Once every stage is quiet: no rows (compacted away), no windows queued, no call running."""
    local = engine.stages.local
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_TIMEOUT_S
    while not local.quiet:
        assert loop.time() < deadline, "the cancelled request's rows or windows were never released"
        await asyncio.sleep(0.01)
    return _snapshot(engine)


@pytest.mark.parametrize(
    "text_tokens",
    [8, 300],
    ids=["talker-free-running", "thinker-still-writing"],
)
def test_closing_a_streaming_speech_reply_stops_every_stage(
    family_speech_engine: Harness, text_tokens: int
) -> None:
    """Both families: Qwen2.5's talker (a codec token per step) and Qwen3's (a frame per step:
    talker + code predictor), each stopping at its next step."""
    speech_engine = family_speech_engine
    engine = speech_engine.engine
    talker = engine.stages.local.talker

    async def speaking_with_the_talker_held(release: threading.Event) -> tuple[Any, asyncio.Future]:
        """A reply two audio chunks in, its talker's next call launched but held (the hardest
        case: the cancel lands between a call's launch and its start). A random talker may end
        its row early (a codec end token): the caller then tries another reply."""
        stream = engine.generate(request(max_tokens=text_tokens, want_audio=True, talker_tokens=2000))
        chunks = 0
        async for event in stream:
            chunks += isinstance(event, AudioChunk)
            if chunks == 2:
                break
        started = threading.Event()

        def hold() -> None:
            started.set()
            release.wait(SETTLE_TIMEOUT_S)

        gate = asyncio.ensure_future(talker.thread.run(hold))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_TIMEOUT_S
        while not (started.is_set() and (talker.thread.waiting or not talker.active)):
            assert loop.time() < deadline, "the talker neither launched its next call nor ended"
            await asyncio.sleep(0.005)
        return stream, gate

    async def go() -> tuple[Snapshot, Snapshot, Snapshot]:
        for _ in range(ATTEMPTS):
            release = threading.Event()
            stream, gate = await speaking_with_the_talker_held(release)
            if talker.active:
                break
            release.set()
            await gate
            await stream.aclose()
        before = _snapshot(engine)
        await stream.aclose()  # what a client disconnect or response.cancel does
        at_cancel = _snapshot(engine)
        release.set()
        await gate
        return before, at_cancel, await _settled(engine)

    before, at_cancel, after = speech_engine.run(go())
    assert before.talker_active == 1, "the talker was still speaking when the reply was cancelled"
    # Rows finished by the cancel: the talker's always; the thinker's if it was still writing.
    assert after.talker_cancelled == before.talker_cancelled + 1
    assert after.thinker_cancelled == before.thinker_cancelled + before.thinker_active
    assert (at_cancel.talker_active, at_cancel.thinker_active) == (0, 0)  # freed at once
    # The talker call launched before the cancel took no step for the cancelled row (a free run
    # of several steps stops before each); the thinker finishes at most its steps in flight (one,
    # and one queued behind it when it queues ahead: OMNI_THINKER_AHEAD).
    assert after.talker_rows == before.talker_rows
    assert after.thinker_rows - at_cancel.thinker_rows <= 1 + engine.stages.local.thinker.ahead
    # No vocoder window launched after the cancel: a queued one is dropped, none is submitted.
    assert after.vocoder_items == at_cancel.vocoder_items
    assert after.vocoder_dropped - before.vocoder_dropped <= 1
    # The slot is free and the next request is served in full.
    events = speech_engine.collect(request(max_tokens=6, want_audio=True, talker_tokens=30))
    assert finished(events).reason == "length"
    assert any(isinstance(e, AudioChunk) for e in events)


def _non_streaming(speech: GenerationRequest) -> GenerationRequest:
    return replace(speech, stream_audio=False)


def test_cancelling_non_streaming_speech_drops_its_queued_windows(speech_engine: Harness) -> None:
    """700 codes are 19 windows: 16 run in the first vocoder call, 3 wait; a cancel drops those."""
    engine = speech_engine.engine
    worker = engine.stages.local.vocoder_worker
    speech = _non_streaming(request(max_tokens=24, want_audio=True, talker_tokens=700))

    async def go() -> tuple[Snapshot, int, Snapshot]:
        launched = worker.items
        stream = engine.generate(speech)
        first = asyncio.ensure_future(stream.__anext__())  # text first, audio at the end
        while not (worker.items > launched and worker.queue_depth > 0):
            assert not first.done() or not isinstance(first.result(), AudioChunk)
            await asyncio.sleep(0.005)
        queued = worker.queue_depth
        at_cancel = _snapshot(engine)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await stream.aclose()
        return at_cancel, queued, await _settled(engine)

    at_cancel, queued, after = speech_engine.run(go())
    assert queued > 0
    assert after.vocoder_dropped - at_cancel.vocoder_dropped == queued  # every waiting window dropped
    assert after.vocoder_items == at_cancel.vocoder_items  # and none launched after the cancel
    events = speech_engine.collect(request(max_tokens=6, want_audio=True, talker_tokens=30))
    assert any(isinstance(e, AudioChunk) for e in events)


def test_non_streaming_speech_is_the_streaming_audio_in_one_chunk(speech_engine: Harness) -> None:
    """Same seed, same codes: the windows (and their noise) are the streaming ones, so the audio
    is the same up to float rounding, with exactly 480 samples per code."""
    speech = request(max_tokens=12, temperature=1.0, seed=11, want_audio=True, talker_tokens=150)
    streamed = speech_engine.collect(speech)
    whole = speech_engine.collect(_non_streaming(replace(speech, request_id=speech.request_id + "-b")))
    streamed_pcm = np.concatenate([e.pcm for e in streamed if isinstance(e, AudioChunk)])
    chunks = [e for e in whole if isinstance(e, AudioChunk)]
    assert len(chunks) == 1
    assert chunks[0].pcm.shape == streamed_pcm.shape
    assert streamed_pcm.size % 480 == 0 and streamed_pcm.size > 480 * 45  # several windows
    assert finished(whole).usage.audio_seconds == pytest.approx(streamed_pcm.size / 24000)
    # Batched (non-streaming) and single (streaming) windows differ by rounding only (see
    # test_vocoder_windows: batched equals single to 1e-4 relative).
    assert np.abs(chunks[0].pcm - streamed_pcm).max() < 1e-3
