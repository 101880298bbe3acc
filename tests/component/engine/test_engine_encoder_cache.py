"""The encoder cache on the real engine (tiny checkpoint, CPU): units encode exactly as the whole
prompt does, media prefetched ahead is a hit for its request, and the greedy answer is the same.

The first two run for both families (Qwen3-Omni-MoE's vision tower too encodes each temporal
patch group of a video on its own, with its DeepStack features).
"""

from __future__ import annotations

import asyncio

import numpy as np
import torch
from engine_harness import Harness, request

from omni_runtime.contract.engine import MediaInput, TextDelta

rng = np.random.default_rng(7)
IMAGE_A = rng.integers(0, 256, (64, 80, 3), dtype=np.uint8)
IMAGE_B = rng.integers(0, 256, (50, 60, 3), dtype=np.uint8)
VIDEO = rng.integers(0, 256, (6, 56, 56, 3), dtype=np.uint8)
AUDIO = (0.1 * rng.standard_normal(16_000)).astype(np.float32)
MEDIA = (
    MediaInput("image", IMAGE_A),
    MediaInput("audio", AUDIO, sample_rate=16_000),
    MediaInput("image", IMAGE_B),
    MediaInput("video", VIDEO, fps=2.0),
)


def text(events) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def test_units_encode_exactly_as_the_whole_prompt(family_speech_engine: Harness) -> None:
    speech_engine = family_speech_engine
    engine = speech_engine.engine

    async def go():
        prompt = await engine.stages.preprocess(request("hi", media=MEDIA))
        engine.encoders.cache.clear()
        units = await engine.encoders.encode(prompt)
        whole_vision = engine.adapter.encode_vision([{**prompt.images, **prompt.videos}])[0]
        whole_audio = engine.adapter.encode_audio([prompt.audio])[0]
        return units, (whole_audio, whole_vision["image"], whole_vision["video"])

    units, whole = speech_engine.run(go())
    for mine, theirs in zip(units, whole, strict=True):
        assert torch.equal(mine, theirs)  # bit for bit: 3 video groups encoded apart, joined


def test_prefetched_media_is_a_hit_and_the_answer_is_the_same(family_speech_engine: Harness) -> None:
    speech_engine = family_speech_engine
    engine = speech_engine.engine

    speech_engine.forget_encodings()
    cold_before = engine.stats()
    cold = text(speech_engine.collect(request("Describe all of it.", media=MEDIA, max_tokens=12)))
    cold_after = engine.stats()
    assert (
        cold_after.encoder_cache_misses - cold_before.encoder_cache_misses == 6
    )  # 1 audio, 2 images, 3 groups

    async def prefetch() -> list[bool]:
        engine.encoders.cache.clear()
        # As a streaming-input session sends them: each image, then each pair of frames as it completes.
        sent = [engine.prefetch_media([MEDIA[0]]), engine.prefetch_media([MEDIA[2]])]
        sent += [engine.prefetch_media([MediaInput("video", VIDEO[i : i + 2], fps=2.0)]) for i in (0, 2, 4)]
        await asyncio.gather(*engine.encoders._tasks)
        return sent

    before = engine.stats()
    assert speech_engine.run(prefetch()) == [True] * 5
    early = engine.stats()
    assert (
        early.prefetch_submitted - before.prefetch_submitted,
        early.prefetch_done - before.prefetch_done,
    ) == (5, 5)
    assert early.encoder_cache_misses - before.encoder_cache_misses == 5
    warm = text(speech_engine.collect(request("Describe all of it.", media=MEDIA, max_tokens=12)))
    after = engine.stats()
    assert after.encoder_cache_hits - early.encoder_cache_hits == 5
    assert after.encoder_cache_misses - early.encoder_cache_misses == 1  # the audio: never sent ahead
    assert warm == cold and warm


def test_a_bounded_cache_evicts_and_prefetch_failures_are_counted(speech_engine: Harness) -> None:
    engine = speech_engine.engine

    async def prefetch(*media: MediaInput) -> None:
        for item in media:
            engine.prefetch_media([item])
        await asyncio.gather(*engine.encoders._tasks)

    async def go():
        cache = engine.encoders.cache
        cache.clear()
        capacity = cache.capacity
        try:
            await prefetch(MediaInput("image", IMAGE_B))
            cache.capacity = cache.bytes  # room for exactly one such output
            before = engine.stats()
            await prefetch(MediaInput("image", IMAGE_B[::-1].copy()))  # same size, other pixels
            await prefetch(
                MediaInput("video", np.zeros((0, 56, 56, 3), dtype=np.uint8), fps=2.0)
            )  # no frames
            return before, engine.stats(), len(cache._entries)
        finally:
            cache.capacity = capacity

    before, after, entries = speech_engine.run(go())
    assert after.encoder_cache_evictions - before.encoder_cache_evictions == 1
    assert entries == 1 and after.encoder_cache_bytes == before.encoder_cache_bytes
    assert after.prefetch_failed - before.prefetch_failed == 1  # counted, never raised
    assert after.prefetch_done - before.prefetch_done == 1


SPEECH = (0.1 * np.random.default_rng(11).standard_normal(85_000)).astype(np.float32)  # 5.3 s at 16 kHz


def test_a_long_audio_encodes_in_chunks_exactly_as_whole(speech_engine: Harness) -> None:
    """Qwen2.5's audio tower encodes each 200-frame (2 s) chunk on its own, so the cache's chunk
    units (two whole chunks and the last 0.3 s) join into exactly the whole audio's encoding."""
    engine = speech_engine.engine
    assert engine.adapter.audio_chunk_frames == 200 and engine.audio_chunk_samples == 32_000

    async def go():
        prompt = await engine.stages.preprocess(
            request("hi", media=(MediaInput("audio", SPEECH, sample_rate=16_000),))
        )
        engine.encoders.cache.clear()
        before = engine.encoders.cache.misses
        chunked, _, _ = await engine.encoders.encode(prompt)
        return chunked, engine.encoders.cache.misses - before, engine.adapter.encode_audio([prompt.audio])[0]

    chunked, units, whole = speech_engine.run(go())
    assert units == 3
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-5)


def test_speech_encoded_while_spoken_is_a_hit_at_the_end_of_the_turn(speech_engine: Harness) -> None:
    """A realtime session sends each whole chunk of the turn being spoken ahead (audio_prefix):
    at the end of speech those chunks are hits, only the last one reaches the encoder, and the
    answer is the one a cold encoder gives."""
    engine = speech_engine.engine
    turn = (MediaInput("audio", SPEECH, sample_rate=16_000),)
    speech_engine.forget_encodings()
    cold = text(speech_engine.collect(request("What did I say?", media=turn, max_tokens=12)))

    async def speak() -> list[bool]:
        engine.encoders.cache.clear()
        sent = []
        for end in (32_800, 64_800):  # as the session does: each whole chunk and 50 ms past it
            prefix = (MediaInput("audio", SPEECH[:end], sample_rate=16_000),)
            sent.append(engine.prefetch_media(prefix, audio_prefix=True))
            await asyncio.gather(*engine.encoders._tasks)
        return sent

    before = engine.stats()
    assert speech_engine.run(speak()) == [True, True]
    early = engine.stats()
    assert early.encoder_cache_misses - before.encoder_cache_misses == 2  # each prefix's new whole chunk
    warm = text(speech_engine.collect(request("What did I say?", media=turn, max_tokens=12)))
    after = engine.stats()
    assert after.encoder_cache_hits - early.encoder_cache_hits == 2
    assert after.encoder_cache_misses - early.encoder_cache_misses == 1  # the last 0.3 s
    assert warm == cold and warm
