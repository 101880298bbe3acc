"""Conversation KV through the real WebSocket: turn N reuses the thinker KV turn N-1 left.

The official openai client drives /v1/realtime through the router; the worker's /metrics
(``omni_session_kv_*``) and each response's ``usage.input_token_details.cached_tokens`` show what
the engine reused. Closing the socket frees the session's kept KV.
"""

from __future__ import annotations

import asyncio
import base64

import httpx
import numpy as np
from openai import AsyncOpenAI

TONE = (0.3 * np.sin(2 * np.pi * 330 * np.arange(8000) / 16000)).astype(np.float32)


async def metric(live, name: str) -> float:
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"http://{live.worker_host}/metrics")).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


async def turn(conn) -> tuple[dict, list]:
    await conn.response.create()
    events = []
    async for event in conn:
        events.append(event)
        if event.type == "response.done":
            return event.response.usage.model_dump(), events
    raise AssertionError("closed before response.done")


async def text_out_session(conn) -> None:
    """Text replies of at most 6 tokens, 16 kHz input, turns ended by the client's commit."""
    await conn.session.update(
        session={
            "type": "realtime",
            "output_modalities": ["text"],
            "instructions": "Answer briefly.",
            "max_output_tokens": 6,
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}},
        }
    )
    async for event in conn:
        if event.type == "session.updated":
            return


async def speak_until_warmed(conn, live, hits_before: float) -> None:
    """Append audio, then wait (no commit yet: the user still speaks) until the history warm-up
    it set off was admitted (a response starting earlier would stop it)."""
    pcm = (TONE * 32767).astype("<i2").tobytes()
    await conn.input_audio_buffer.append(audio=base64.b64encode(pcm).decode())
    for _ in range(500):
        if await metric(live, "omni_session_kv_hits_total") > hits_before:
            break
        await asyncio.sleep(0.02)
    assert await metric(live, "omni_session_kv_hits_total") == hits_before + 1


async def kept_sessions_reach(live, count: float) -> float:
    """The kept-session gauge once the last turn's KV is kept (it is copied as its row ends)."""
    for _ in range(500):
        value = await metric(live, "omni_session_kv_sessions")
        if value >= count:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"omni_session_kv_sessions stayed below {count}")


async def test_turn_n_reuses_turn_n_minus_1_kv_and_close_frees_it(live) -> None:
    client = AsyncOpenAI(base_url=f"http://{live.router_host}/v1", api_key="unused")
    hits0 = await metric(live, "omni_session_kv_hits_total")
    reused0 = await metric(live, "omni_session_kv_reused_tokens_total")
    async with client.realtime.connect(model="tiny") as conn:
        created = await conn.recv()
        session_id = created.session.id
        await text_out_session(conn)
        sessions0 = await metric(live, "omni_session_kv_sessions")

        # Turn 1: text in. Nothing kept yet: a full prefill.
        await conn.conversation.item.create(
            item={
                "id": "item_user_1",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hi."}],
            }
        )
        usage1, _ = await turn(conn)
        assert usage1["input_token_details"]["cached_tokens"] == 0
        await kept_sessions_reach(live, sessions0 + 1)

        # Turn 2: audio in. Everything of turn 1's prompt comes from the kept KV (the first
        # append also warms the history: one more hit, see the test below).
        await speak_until_warmed(conn, live, hits0)
        await conn.input_audio_buffer.commit()
        usage2, _ = await turn(conn)
        cached2 = usage2["input_token_details"]["cached_tokens"]
        assert usage1["input_tokens"] <= cached2 < usage2["input_tokens"]
        assert await metric(live, "omni_session_kv_hits_total") == hits0 + 2
        assert await metric(live, "omni_session_kv_reused_tokens_total") >= reused0 + cached2
        await kept_sessions_reach(live, sessions0 + 1)

        # Turn 3 after deleting turn 1's user item: only the system prompt (and the next turn's
        # opening marker) still agrees with the kept KV; the rest is prefilled again.
        await conn.conversation.item.delete(item_id="item_user_1")
        async for event in conn:
            if event.type == "conversation.item.deleted":
                break
        usage3, _ = await turn(conn)
        cached3 = usage3["input_token_details"]["cached_tokens"]
        assert 0 < cached3 < usage1["input_tokens"]
        assert await metric(live, "omni_session_kv_hits_total") == hits0 + 3
        await kept_sessions_reach(live, sessions0 + 1)

    # Closing the socket frees the session's entry.
    for _ in range(500):
        if session_id not in live.engine.stages.local.thinker.kv:
            break
        await asyncio.sleep(0.02)
    assert session_id not in live.engine.stages.local.thinker.kv
    assert await metric(live, "omni_session_kv_sessions") == sessions0


async def test_the_history_is_prefilled_while_the_user_speaks(live) -> None:
    """A text item added after a reply is not in the kept KV; the user's first audio warms the
    history (one more hit, before any commit), and the response then reuses all of it."""
    client = AsyncOpenAI(base_url=f"http://{live.router_host}/v1", api_key="unused")
    async with client.realtime.connect(model="tiny") as conn:
        await conn.recv()
        await text_out_session(conn)
        text = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi."}]}
        await conn.conversation.item.create(item=text)
        await turn(conn)
        await conn.conversation.item.create(
            item={**text, "content": [{"type": "input_text", "text": "Here is more context."}]}
        )
        hits0 = await metric(live, "omni_session_kv_hits_total")
        reused0 = await metric(live, "omni_session_kv_reused_tokens_total")
        prefilled0 = await metric(live, "omni_session_kv_prefilled_tokens_total")
        await speak_until_warmed(conn, live, hits0)
        warm_reused = await metric(live, "omni_session_kv_reused_tokens_total") - reused0
        warm_prompt = warm_reused + await metric(live, "omni_session_kv_prefilled_tokens_total") - prefilled0
        await conn.input_audio_buffer.commit()
        usage, _ = await turn(conn)
        cached = usage["input_token_details"]["cached_tokens"]
        # Everything the warm-up prefilled but its generation prompt ("assistant\n" after the
        # turn marker, where the response's prompt opens the user's turn instead).
        opening = len(live.engine.adapter.tokenizer.encode("assistant\n", add_special_tokens=False))
        assert cached == warm_prompt - opening and cached > warm_reused
