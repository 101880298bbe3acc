"""The official openai client drives /v1/realtime on the real engine, through the router.

Both families (Qwen2.5-Omni and Qwen3-Omni-MoE): one full speech turn (text in, audio and its
transcript out) and one audio-in turn (the family's own audio encoder), with the history kept.
"""

from __future__ import annotations

import base64

import numpy as np
from openai import AsyncOpenAI


async def collect(conn, until: str) -> list:
    events = []
    async for event in conn:
        events.append(event)
        if event.type == until:
            return events
    raise AssertionError(f"closed before {until}")


async def test_two_turns_text_and_audio_in_text_and_audio_out_history_kept(family_live, speech_wav) -> None:
    live = family_live
    client = AsyncOpenAI(base_url=f"http://{live.router_host}/v1", api_key="unused")
    speech = speech_wav("What is the weather like", "question")
    async with client.realtime.connect(model="tiny") as conn:
        created = await conn.recv()
        assert created.type == "session.created"
        session_id = created.session.id
        assert session_id.startswith("rt_tiny-w0.")
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["audio"],
                "instructions": "Answer briefly.",
                "max_output_tokens": 6,
                "audio": {
                    "input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None},
                    "output": {"format": {"type": "audio/pcm", "rate": 24000}},
                },
            }
        )
        await collect(conn, "session.updated")

        # Turn 1: text in, audio (with transcript) out.
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hello there."}],
            }
        )
        await conn.response.create()
        first = await collect(conn, "response.done")
        done1 = first[-1].response
        assert done1.status in ("completed", "incomplete")
        audio1 = b"".join(base64.b64decode(e.delta) for e in first if e.type == "response.output_audio.delta")
        transcript1 = "".join(e.delta for e in first if e.type == "response.output_audio_transcript.delta")
        assert len(audio1) > 0 and len(audio1) % 2 == 0
        assert transcript1 == done1.output[0].content[0].transcript

        # Turn 2: audio in (committed by the client), text out.
        for start in range(0, speech.size, 1600):
            chunk = (np.clip(speech[start : start + 1600], -1, 1) * 32767).astype("<i2").tobytes()
            await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
        await conn.input_audio_buffer.commit()
        await conn.response.create(response={"output_modalities": ["text"]})
        second = await collect(conn, "response.done")
        assert any(e.type == "input_audio_buffer.committed" for e in second)
        done2 = second[-1].response
        text2 = "".join(e.delta for e in second if e.type == "response.output_text.delta")
        assert text2 and done2.output[0].content[0].text == text2
        assert not [e for e in second if e.type == "response.output_audio.delta"]

    # History: the second prompt holds the instructions, turn 1 (user and assistant) and the audio.
    # A fresh session asked only the audio question has a much shorter prompt.
    async with client.realtime.connect(model="tiny") as fresh:
        await fresh.recv()
        await fresh.session.update(
            session={
                "type": "realtime",
                "instructions": "Answer briefly.",
                "output_modalities": ["text"],
                "max_output_tokens": 2,
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}},
            }
        )
        for start in range(0, speech.size, 1600):
            chunk = (np.clip(speech[start : start + 1600], -1, 1) * 32767).astype("<i2").tobytes()
            await fresh.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
        await fresh.input_audio_buffer.commit()
        await fresh.response.create()
        alone = (await collect(fresh, "response.done"))[-1].response
    history_tokens = done2.usage.input_tokens - alone.usage.input_tokens
    # "Hello there." as a user turn plus the assistant's reply, each with its chat-template tokens.
    assert history_tokens >= done1.usage.output_token_details.text_tokens + 3
