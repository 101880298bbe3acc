"""Streaming-input sessions as the RFC describes them, on the real engine through the router.

A client written from the RFC (REFERENCE.md "Streaming-input sessions"): Mode B's session
resource, and Mode A's one chunked chat request whose upload sleeps between frames. The engine's
own counters show the early work: images and video frame pairs reach their encoders while input is
still arriving (prefetch done, encoder misses), and the request built at the end finds them
(encoder hits, no new misses); the greedy answer is the same as without early work.

Both families run the Mode B early-encoding test (images and video frames through each family's
vision encoder); the rest runs on Qwen2.5-Omni.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
from typing import Any

import httpx
import numpy as np
from PIL import Image

BASE = "/v1/streaming_input/sessions"


def png(seed: int, size: tuple[int, int] = (56, 84)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def clear_cache(live) -> None:
    async def clear() -> None:
        live.engine.encoders.cache.clear()

    live.call(clear())


async def counters_until(live, ready, *, timeout: float = 120.0) -> Any:
    """Engine stats once ``ready(stats)`` holds (the early work runs on the worker meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = live.engine.stats()
        if ready(stats):
            return stats
        assert time.monotonic() < deadline, f"the engine never got there: {stats}"
        await asyncio.sleep(0.05)


# Two images and four video frames: four encoder units (each image, each pair of frames).
MEDIA = [
    ("image", png(1)),
    ("video", png(2)),
    ("video", png(3)),
    ("image", png(4)),
    ("video", png(5)),
    ("video", png(6)),
]
UNITS = 4


async def run_session(client: httpx.AsyncClient, live, policy: str) -> tuple[str, Any, Any]:
    """One Mode B session: the media, then (after the early work, if any) the end of input."""
    created = await client.post(BASE, json={"temperature": 0, "max_tokens": 10, "start_policy": policy})
    session = created.json()["session_id"]
    before = live.engine.stats()
    acks = []
    for seq, (modality, data) in enumerate(MEDIA):
        chunk = {"sequence_id": seq, "modality": modality, "payload": b64(data)}
        acks.append((await client.post(f"{BASE}/{session}/chunks", json=chunk)).json())
    early = await counters_until(
        live, lambda s: policy == "on_end_only" or s.prefetch_done - before.prefetch_done == UNITS
    )
    last = {"sequence_id": len(MEDIA), "modality": "text", "text": "What do you see?", "end_of_input": True}
    assert (await client.post(f"{BASE}/{session}/chunks", json=last)).status_code == 202
    result = await client.get(f"{BASE}/{session}/result", params={"wait": 120})
    assert result.status_code == 200, result.text
    after = live.engine.stats()
    started = [ack["started"] for ack in acks]
    return result.json()["choices"][0]["message"]["content"], (before, early, after), started


async def test_media_is_encoded_before_end_of_input_and_the_request_finds_it(family_live) -> None:
    live = family_live
    async with httpx.AsyncClient(base_url=f"http://{live.router_host}", timeout=300) as client:
        await clear_cache(live)
        late, (before, early, after), started = await run_session(client, live, "on_end_only")
        assert started == [False] * len(MEDIA)  # nothing submitted: "started" says so
        assert early.encoder_cache_misses == before.encoder_cache_misses  # no encoder ran before the end
        assert after.encoder_cache_misses - before.encoder_cache_misses == UNITS  # all of it at the end

        await clear_cache(live)
        eager, (before, early, after), started = await run_session(client, live, "on_first_chunk")
        assert started == [True] * len(MEDIA)  # each chunk's ack: work was submitted
        assert early.prefetch_submitted - before.prefetch_submitted == UNITS
        assert early.encoder_cache_misses - before.encoder_cache_misses == UNITS  # encoded before the end
        assert after.encoder_cache_misses == early.encoder_cache_misses  # nothing encoded again at the end
        assert after.encoder_cache_hits - early.encoder_cache_hits == UNITS
        metrics = (await client.get(f"http://{live.worker_host}/metrics")).text
    assert eager == late and eager  # greedy: the same tokens with and without the early work
    scraped = {
        line.split()[0]: float(line.split()[1]) for line in metrics.splitlines() if line.startswith("omni_")
    }
    assert scraped["omni_encoder_cache_hits_total"] >= after.encoder_cache_hits > 0
    assert scraped["omni_media_prefetch_done_total"] >= after.prefetch_done >= UNITS
    assert scraped["omni_encoder_cache_bytes"] > 0


async def test_mode_a_upload_is_encoded_while_it_arrives(live) -> None:
    """One chunked POST, Content-Type application/x-multipart-streaming, modality left to inference."""
    await clear_cache(live)
    before = live.engine.stats()
    seen: dict[str, Any] = {}

    async def upload():
        yield (
            json.dumps(
                {"temperature": 0, "max_tokens": 6, "stream": True, "start_policy": "on_first_chunk"}
            ).encode()
            + b"\n"
        )
        for seed in (11, 12):
            await asyncio.sleep(0.2)  # a slow client: frames arrive over time
            yield json.dumps({"payload": b64(png(seed))}).encode() + b"\n"  # an image, by its bytes
        # Before the last frame leaves the client, the worker has encoded the images already.
        seen["early"] = await counters_until(live, lambda s: s.prefetch_done - before.prefetch_done == 2)
        yield json.dumps({"text": "Compare them.", "end_of_input": True}).encode() + b"\n"

    async with (
        httpx.AsyncClient(base_url=f"http://{live.router_host}", timeout=300) as client,
        client.stream(
            "POST",
            "/v1/chat/completions",
            content=upload(),
            headers={"Content-Type": "application/x-multipart-streaming"},
        ) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line[6:] async for line in response.aiter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    text = "".join(json.loads(line)["choices"][0]["delta"].get("content") or "" for line in lines[:-1])
    assert text
    early, after = seen["early"], live.engine.stats()
    assert early.encoder_cache_misses - before.encoder_cache_misses == 2
    assert after.encoder_cache_misses == early.encoder_cache_misses
    assert after.encoder_cache_hits - early.encoder_cache_hits == 2


async def new_session(client: httpx.AsyncClient, **params: Any) -> str:
    return (await client.post(BASE, json={"temperature": 0, "max_tokens": 4, **params})).json()["session_id"]


async def test_offsets_in_place_of_sequence_ids_by_patch_and_append(live) -> None:
    async with httpx.AsyncClient(base_url=f"http://{live.router_host}", timeout=300) as client:
        session = await new_session(client)
        later = await client.patch(f"{BASE}/{session}", json={"offset": 10, "text": "now."})
        assert later.status_code == 202 and later.json()["next_offset"] == 0  # waits for bytes 0..9
        middle = await client.post(f"{BASE}/{session}/append", json={"offset": 4, "text": "hello "})
        assert middle.json()["next_offset"] == 0
        again = await client.post(f"{BASE}/{session}/chunks", json={"offset": 4, "text": "hello "})
        assert again.status_code == 200 and again.json()["duplicate"] is True
        first = await client.post(f"{BASE}/{session}/chunks", json={"offset": 0, "text": "Say "})
        assert first.json()["next_offset"] == 14
        mixed = await client.post(f"{BASE}/{session}/chunks", json={"sequence_id": 9, "text": "x"})
        assert mixed.status_code == 400 and mixed.json()["error"]["param"] == "sequence_id"
        assert (await client.post(f"{BASE}/{session}/finish")).json()["status"] in ("generating", "done")
        result = await client.get(f"{BASE}/{session}/result", params={"wait": 120})
        assert result.status_code == 200 and result.json()["choices"][0]["message"]["content"]


async def test_a_repeated_end_of_input_is_idempotent(live) -> None:
    async with httpx.AsyncClient(base_url=f"http://{live.router_host}", timeout=300) as client:
        session = await new_session(client)
        last = {"sequence_id": 0, "text": "Say hello.", "end_of_input": True}  # modality left out: text
        assert (await client.post(f"{BASE}/{session}/chunks", json=last)).status_code == 202
        # The same end again (a retry), and a bare end marker, twice: each a 200, none a conflict.
        assert (await client.post(f"{BASE}/{session}/chunks", json=last)).json()["duplicate"] is True
        ends = [await client.post(f"{BASE}/{session}/chunks", json={"end_of_input": True}) for _ in range(2)]
        assert [e.status_code for e in ends] == [200, 200]
        result = await client.get(f"{BASE}/{session}/result", params={"wait": 120})
        assert result.status_code == 200
        after = await client.post(f"{BASE}/{session}/chunks", json={"end_of_input": True})
        assert after.status_code == 200 and after.json()["status"] == "done"


async def test_a_413_closes_the_session(live) -> None:
    async with httpx.AsyncClient(base_url=f"http://{live.router_host}", timeout=300) as client:
        session = await new_session(client)
        gauge = live.realtime.metrics.sessions.labels(kind="streaming_input")
        before = gauge._value.get()
        big = await client.post(  # past the payload cap (2 MiB on this worker)
            f"{BASE}/{session}/chunks",
            json={"sequence_id": 0, "modality": "audio", "payload": b64(bytes(2 * 1024 * 1024 + 2))},
        )
        assert big.status_code == 413
        assert big.json()["error"]["param"] == "chunks[0].payload"
        assert "session is closed" in big.json()["error"]["message"]
        assert (await client.get(f"{BASE}/{session}")).status_code == 404
        assert gauge._value.get() == before - 1
