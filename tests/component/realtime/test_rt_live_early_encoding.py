"""Speech encoded while it is spoken, through the real /v1/realtime socket and the router.

The session sends each whole 2 s chunk of the turn being spoken to the engine's audio encoder as
it completes (Engine.audio_chunk_samples, `EarlyEncoding`); at the end of the turn only the last
chunk is left to encode, and the reply is the one a cold encoder gives.
"""

from __future__ import annotations

import asyncio

from rt_client import RawRealtime

SENTENCE = "The quick brown fox jumps over the lazy dog, and then it runs far away into the green forest."


async def _settle(live, session) -> None:
    """Wait until the chunks sent ahead are encoded and the session's warm-ups (which read them
    from the encoder cache too) are over: the user still speaks."""
    for _ in range(600):
        await asyncio.sleep(0.02)
        stats = live.engine.stats()
        idle = stats.prefetch_done + stats.prefetch_failed >= stats.prefetch_submitted
        if idle and not session.warmer.running:
            return


async def _turn(live, speech) -> tuple[str, int]:
    rt = await RawRealtime.connect(f"ws://{live.router_host}/v1/realtime")
    created = await rt.until("session.created")
    session = live.realtime.sessions.get(created["session"]["id"])
    await rt.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "output_modalities": ["text"],
                "max_output_tokens": 8,
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}},
            },
        }
    )
    await rt.until("session.updated")
    await rt.append_audio(speech)
    await _settle(live, session)  # hits counted from here are the turn's own
    hits = live.engine.stats().encoder_cache_hits
    await rt.send({"type": "input_audio_buffer.commit"})
    await rt.send({"type": "response.create"})
    done = await rt.until("response.done")
    await rt.close()
    reply = done["response"]["output"][0]["content"][0]["text"]
    return reply, live.engine.stats().encoder_cache_hits - hits


def test_a_spoken_turn_is_encoded_chunk_by_chunk_as_it_arrives(live, speech_wav) -> None:
    speech = speech_wav(SENTENCE, "fox")
    chunks = (speech.size - 800) // 32_000
    assert chunks >= 2, f"espeak made {speech.size / 16000:.1f} s: too short for two whole chunks"

    async def go():
        live.engine.encoders.cache.clear()
        before = live.engine.stats()
        warm = await _turn(live, speech)
        sent = live.engine.stats().prefetch_submitted - before.prefetch_submitted
        return warm, sent

    (warm_text, hits), sent = live.call(go())
    assert sent == chunks
    assert hits == chunks, "each chunk sent ahead is a hit at the end of the turn"
    assert warm_text


async def _spoken_turn(live, host: str, realtime, speech) -> tuple[str, dict, int]:
    """One turn on the worker at ``host``: speech appended in 0.5 s pieces, each followed by a
    pause for the session's warm-ups (the user still speaks), then commit and a text reply."""
    rt = await RawRealtime.connect(f"ws://{host}/v1/realtime")
    created = await rt.until("session.created")
    session = realtime.sessions.get(created["session"]["id"])
    await rt.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "instructions": "Answer briefly.",
                "temperature": 0.0,
                "output_modalities": ["text"],
                "max_output_tokens": 8,
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}},
            },
        }
    )
    await rt.until("session.updated")
    for start in range(0, speech.size, 8000):
        await rt.append_audio(speech[start : start + 8000])
        await _settle(live, session)
    spoken = session.warmer.spoken
    await rt.send({"type": "input_audio_buffer.commit"})
    await rt.send({"type": "response.create"})
    done = await rt.until("response.done")
    await rt.close()
    return done["response"]["output"][0]["content"][0]["text"], done["response"]["usage"], spoken


def test_with_warm_spoken_audio_the_speech_is_prefilled_while_it_is_spoken(live, speech_wav) -> None:
    """``warm_spoken_audio`` (on by default; ``OMNI_WARM_SPOKEN_AUDIO=0`` is the plain worker): each whole encoder chunk of the turn
    being spoken is prefilled into the session's KV with the history, so the response reuses it:
    every whole chunk's audio tokens more than with the history warm-up alone, and the same reply
    (greedy), because reuse stops where the warmed audio's embedding differs from the turn's."""
    speech = speech_wav(SENTENCE, "fox")
    chunks = (speech.size - 800) // 32_000
    assert chunks >= 2, f"espeak made {speech.size / 16000:.1f} s: too short for two whole chunks"
    host, spoken_server = live.extra_worker(warm_spoken_audio=True)
    plain_host, plain_server = live.extra_worker(warm_spoken_audio=False)

    async def go():
        live.engine.encoders.cache.clear()
        plain = await _spoken_turn(live, plain_host, plain_server, speech)
        live.engine.encoders.cache.clear()
        warmed = await _spoken_turn(live, host, spoken_server, speech)
        return plain, warmed

    (plain_text, plain_usage, plain_spoken), (text, usage, spoken) = live.call(go())
    assert plain_spoken == 0 and spoken >= chunks  # a warm-up per whole chunk (the last covers all)
    assert text == plain_text
    assert usage["input_tokens"] == plain_usage["input_tokens"]
    per_chunk = 50  # Qwen2.5-Omni: 25 audio tokens a second, 2 s chunks
    cached, plain_cached = (u["input_token_details"]["cached_tokens"] for u in (usage, plain_usage))
    opening = len(live.engine.adapter.tokenizer.encode("user\n<|audio_bos|>", add_special_tokens=False))
    assert cached == plain_cached + opening + chunks * per_chunk, (cached, plain_cached, opening, chunks)
    assert usage["input_tokens"] - cached < plain_usage["input_tokens"] - plain_cached - chunks * per_chunk
