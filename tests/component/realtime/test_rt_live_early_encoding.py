"""Speech encoded while it is spoken, through the real /v1/realtime socket and the router.

The session sends each whole 2 s chunk of the turn being spoken to the engine's audio encoder as
it completes (Engine.audio_chunk_samples, `EarlyEncoding`); at the end of the turn only the last
chunk is left to encode, and the reply is the one a cold encoder gives.
"""

from __future__ import annotations

import asyncio

from rt_client import RawRealtime

SENTENCE = "The quick brown fox jumps over the lazy dog, and then it runs far away into the green forest."


async def _turn(live, speech) -> tuple[str, int]:
    rt = await RawRealtime.connect(f"ws://{live.router_host}/v1/realtime")
    await rt.until("session.created")
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
    for _ in range(600):  # the chunks sent ahead are encoded while the "user" still speaks
        await asyncio.sleep(0.05)
        stats = live.engine.stats()
        if stats.prefetch_done + stats.prefetch_failed >= stats.prefetch_submitted:
            break
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
