"""Streaming video and streaming-input sessions on the real engine, through the router.

Both families answer the video query (frames through the family's vision encoder) and the
shuffled streaming-input session (audio chunks, the same answer as the whole request); the rest
runs on Qwen2.5-Omni.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import random
import time

import httpx
import numpy as np
from PIL import Image
from rt_client import RawRealtime

from omni_runtime.contract.engine import ChatTurn, GenerationRequest, MediaInput, SamplingParams, TextDelta

BASE = "/v1/streaming_input/sessions"


def frame(seed: int) -> str:
    """A camera-like frame: a coloured scene with an object whose place depends on ``seed``."""
    pixels = np.zeros((112, 112, 3), dtype=np.uint8)
    pixels[:] = ((seed * 70) % 256, (200 - seed * 45) % 256, (seed * 110) % 256)
    pixels[10 + seed * 15 : 40 + seed * 15, 20:60] = 255
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=95)
    return base64.b64encode(buffer.getvalue()).decode()


async def test_video_socket_filters_evicts_and_answers(family_live) -> None:
    live = family_live
    rt = await RawRealtime.connect(f"ws://{live.router_host}/v1/video/chat/stream")
    await rt.send(
        {
            "type": "session.config",
            "modalities": ["text"],
            "num_sample_frames": 2,
            "max_frames": 3,
            "evs_threshold": 0.95,
            "sampling_params_list": [{"max_tokens": 3, "temperature": 0}],
        }
    )
    for seed in (1, 1, 2, 2, 3, 4):
        await rt.send({"type": "video.frame", "data": frame(seed)})
    await rt.send({"type": "audio.chunk", "data": base64.b64encode(np.zeros(3200, "<i2").tobytes()).decode()})
    await rt.send({"type": "video.query", "text": "What do you see?"})
    start = await rt.until("response.start")
    assert start["stats"]["frames_received"] == 6
    assert start["stats"]["frames_filtered"] == 2  # the repeated frames
    assert start["stats"]["frames_kept"] == 4 and start["stats"]["frames_evicted"] == 1
    assert start["stats"]["frames_buffered"] == 3
    text_done = await rt.until("response.text.done")
    deltas = [e["delta"] for e in rt.events if e["type"] == "response.text.delta"]
    assert text_done["text"] == "".join(deltas) and text_done["text"]
    assert (await rt.until("response.done"))["status"] == "completed"
    await rt.send({"type": "video.done"})
    done = await rt.until("session.done")
    assert done["stats"]["frames_kept"] == 4
    await rt.close()


def chunk(seq: int, modality: str, data: bytes, *, end: bool = False) -> dict:
    return {
        "sequence_id": seq,
        "modality": modality,
        "payload": base64.b64encode(data).decode(),
        "end_of_input": end,
    }


async def test_shuffled_duplicated_chunks_give_the_whole_request_answer(family_live) -> None:
    live = family_live
    rng = np.random.default_rng(5)
    audio = (0.1 * rng.standard_normal(16_000)).astype(np.float32)
    pcm = (audio * 32767).astype("<i2")
    chunks = [
        chunk(0, "text", b"Listen to this "),
        chunk(1, "audio", pcm[:6000].tobytes()),
        chunk(2, "audio", pcm[6000:].tobytes()),
        chunk(3, "text", b"and describe it.", end=True),
    ]
    order = [*chunks, chunks[1], chunks[3]]
    random.Random(11).shuffle(order)
    async with httpx.AsyncClient(base_url=f"http://{live.router_host}", timeout=300) as client:
        created = (
            await client.post(
                BASE, json={"temperature": 0, "max_tokens": 8, "start_policy": "on_first_chunk"}
            )
        ).json()
        session_id = created["session_id"]
        assert session_id.startswith("si_tiny-w0.")
        acks = [await client.post(f"{BASE}/{session_id}/chunks", json=c) for c in order]
        assert sorted(a.status_code for a in acks) == [200, 200, 202, 202, 202, 202]
        first = await client.post(f"{BASE}/{session_id}/finish")
        second = await client.post(f"{BASE}/{session_id}/finish")
        assert first.status_code == second.status_code == 200
        result = await client.get(f"{BASE}/{session_id}/result")
        assert result.status_code == 200
        answer = result.json()["choices"][0]["message"]["content"]

    whole = GenerationRequest(
        request_id="whole",
        turns=(
            ChatTurn(
                role="user",
                text="Listen to this and describe it.",
                media=(MediaInput(kind="audio", data=pcm.astype(np.float32) / 32768, sample_rate=16_000),),
            ),
        ),
        sampling=SamplingParams(max_tokens=8, temperature=0),
    )

    async def generate_whole() -> str:
        return "".join([e.text async for e in live.engine.generate(whole) if isinstance(e, TextDelta)])

    assert answer == live.call(generate_whole())
    assert answer


async def test_mode_a_ndjson_body_through_the_router(live) -> None:
    frames = [
        {"temperature": 0, "max_tokens": 6},
        {"modality": "text", "text": "Say hello "},
        {"modality": "text", "text": "to the user.", "end_of_input": True},
    ]

    async def body():
        for item in frames:
            yield (json.dumps(item) + "\n").encode()
            await asyncio.sleep(0.05)  # frames arrive over time on one chunked request

    async with httpx.AsyncClient(base_url=f"http://{live.router_host}", timeout=300) as client:
        response = await client.post(
            "/v1/chat/completions",
            content=body(),
            headers={"X-Streaming-Input": "true", "Content-Type": "application/x-ndjson"},
        )
        assert response.status_code == 200, response.text
        reply = response.json()
        plain = await client.post(
            "/v1/chat/completions",
            json={
                "model": reply["model"],
                "temperature": 0,
                "max_tokens": 6,
                "messages": [{"role": "user", "content": "Say hello to the user."}],
            },
        )
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"]["content"] == plain.json()["choices"][0]["message"]["content"]


async def test_payload_cap_is_413_and_idle_sessions_are_released(live) -> None:
    async with httpx.AsyncClient(base_url=f"http://{live.router_host}", timeout=60) as client:
        session_id = (await client.post(BASE, json={})).json()["session_id"]
        too_big = await client.post(
            f"{BASE}/{session_id}/chunks", json=chunk(0, "audio", bytes(3 * 1024 * 1024))
        )
        assert too_big.status_code == 413
        assert too_big.json()["error"]["code"] == "payload_too_large"
        # The 413 closed the session: follow-ups find no session.
        assert (
            await client.post(f"{BASE}/{session_id}/chunks", json=chunk(0, "text", b"ok"))
        ).status_code == 404

    host, realtime = live.extra_worker(session_timeout_s=0.5)
    async with httpx.AsyncClient(base_url=f"http://{host}", timeout=60) as client:
        session_id = (await client.post(BASE, json={})).json()["session_id"]
        await client.post(f"{BASE}/{session_id}/chunks", json=chunk(0, "audio", bytes(64_000)))
        assert len(realtime.streaming.sessions) == 1
        deadline = time.monotonic() + 10
        while realtime.streaming.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not realtime.streaming.sessions
        gone = await client.get(f"{BASE}/{session_id}")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "session_not_found"


async def test_limits_are_in_the_worker_metrics(live) -> None:
    async with httpx.AsyncClient(base_url=f"http://{live.worker_host}") as client:
        text = (await client.get("/metrics")).text
    assert 'omni_realtime_limit{name="max_payload_per_session"} 2.097152e+06' in text
    assert 'omni_realtime_sessions{kind="realtime"}' in text
