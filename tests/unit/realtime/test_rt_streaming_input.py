"""Streaming-input sessions over HTTP (Mode B) and the NDJSON chat body (Mode A), scripted engine."""

from __future__ import annotations

import base64
import io
import json
import random
import time

import numpy as np
import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient
from PIL import Image

from omni_runtime.api.chat.routes import ChatCompletionsRoute
from omni_runtime.api.streaming_input.routes import install_streaming_input
from omni_runtime.contract.sessions import worker_of
from omni_runtime.realtime import RealtimeServer, RealtimeSettings

BASE = "/v1/streaming_input/sessions"


def make_client(engine, **overrides) -> tuple[TestClient, RealtimeServer]:
    server = RealtimeServer(engine=engine, settings=RealtimeSettings(worker_id="w0", **overrides))
    app = FastAPI()
    app.include_router(server.router())
    install_streaming_input(app, server.streaming)
    chat_router = APIRouter(route_class=ChatCompletionsRoute)

    @chat_router.post("/v1/chat/completions")
    async def chat() -> dict[str, str]:
        return {"route": "ordinary chat"}

    app.include_router(chat_router)
    return TestClient(app), server


def text_chunk(seq: int, text: str, *, end: bool = False) -> dict:
    return {
        "sequence_id": seq,
        "modality": "text",
        "payload": base64.b64encode(text.encode()).decode(),
        "end_of_input": end,
    }


def audio_chunk(seq: int, pcm: np.ndarray, *, end: bool = False) -> dict:
    data = (pcm * 32767).astype("<i2").tobytes()
    return {
        "sequence_id": seq,
        "modality": "audio",
        "payload": base64.b64encode(data).decode(),
        "end_of_input": end,
    }


def test_shuffled_duplicated_chunks_assemble_in_order(engine) -> None:
    client, _ = make_client(engine)
    audio = (0.2 * np.sin(np.arange(16_000) / 8)).astype(np.float32)
    chunks = [
        text_chunk(0, "Describe "),
        audio_chunk(1, audio[:8000]),
        text_chunk(2, "this "),
        audio_chunk(3, audio[8000:]),
        text_chunk(4, "sound.", end=True),
    ]
    order = chunks + chunks[:3]
    random.Random(3).shuffle(order)
    with client:
        created = client.post(BASE, json={"temperature": 0, "stream": False})
        assert created.status_code == 200
        session_id = created.json()["session_id"]
        assert worker_of(session_id) == "w0" and created.json()["expires_in"] == 300
        codes = [client.post(f"{BASE}/{session_id}/chunks", json=chunk).status_code for chunk in order]
        assert sorted(codes) == [200] * 3 + [202] * 5  # duplicates acknowledged, ignored
        result = client.get(f"{BASE}/{session_id}/result")
        assert result.status_code == 200
        assert result.json()["choices"][0]["message"]["content"] == "turns1 w1 w2 w3"
        assert client.post(f"{BASE}/{session_id}/finish").json()["status"] == "done"
        assert client.post(f"{BASE}/{session_id}/finish").json()["status"] == "done"  # idempotent
    (user,) = engine.requests[0].turns
    assert user.text == "Describe this sound."
    assert user.media[0].kind == "audio"
    np.testing.assert_array_equal(user.media[0].data, (audio * 32767).astype("<i2") / np.float32(32768))


def test_finish_without_end_flag_waits_for_gaps_and_streams_sse(engine) -> None:
    client, _ = make_client(engine)
    with client:
        session_id = client.post(BASE, json={"stream": True, "first_chunk": text_chunk(0, "a")}).json()[
            "session_id"
        ]
        client.post(f"{BASE}/{session_id}/chunks", json=text_chunk(2, "c"))
        status = client.post(f"{BASE}/{session_id}/finish").json()
        assert (status["status"], status["missing"]) == ("collecting", [1])
        assert client.get(f"{BASE}/{session_id}/result").json()["error"]["code"] == "input_not_finished"
        client.post(f"{BASE}/{session_id}/chunks", json=text_chunk(1, "b"))
        with client.stream("GET", f"{BASE}/{session_id}/stream") as response:
            lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
        late = client.post(f"{BASE}/{session_id}/chunks", json=text_chunk(3, "d"))
        assert late.status_code == 409 and late.json()["error"]["code"] == "session_finished"
    assert lines[-1] == "[DONE]"
    deltas = [json.loads(line)["choices"][0]["delta"].get("content", "") for line in lines[:-1]]
    assert "".join(deltas) == "turns1 w1 w2 w3"
    assert engine.requests[0].turns[0].text == "abc"


def test_payload_cap_413_unknown_session_404_and_bad_chunks(engine) -> None:
    client, _ = make_client(engine, max_payload_per_session=1000)
    with client:
        session_id = client.post(BASE, json={}).json()["session_id"]
        big = client.post(f"{BASE}/{session_id}/chunks", json=text_chunk(0, "x" * 1001))
        assert big.status_code == 413 and big.json()["error"]["code"] == "payload_too_large"
        assert "session is closed" in big.json()["error"]["message"]
        # A 413 closes the session: its id is gone, and its slot with it.
        assert client.get(f"{BASE}/{session_id}").status_code == 404
        session_id = client.post(BASE, json={}).json()["session_id"]
        ok = client.post(f"{BASE}/{session_id}/chunks", json=text_chunk(0, "x" * 600))
        assert ok.status_code == 202
        over = client.post(f"{BASE}/{session_id}/chunks", json=text_chunk(1, "y" * 600))
        assert over.status_code == 413
        assert client.post(f"{BASE}/{session_id}/chunks", json=text_chunk(1, "y")).status_code == 404
        session_id = client.post(BASE, json={}).json()["session_id"]
        bad = client.post(
            f"{BASE}/{session_id}/chunks", json={"sequence_id": 1, "modality": "smell", "payload": ""}
        )
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "modality"
        odd = client.post(
            f"{BASE}/{session_id}/chunks", json={"sequence_id": 1, "modality": "audio", "payload": "AAAA"}
        )
        assert odd.status_code == 400
        broken = client.post(
            f"{BASE}/{session_id}/chunks", content=b"{nope", headers={"content-type": "application/json"}
        )
        assert broken.json()["error"]["code"] == "invalid_json"
        missing = client.post(f"{BASE}/si_w0.doesnotexist/chunks", json=text_chunk(0, "x"))
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "session_not_found"
        assert client.delete(f"{BASE}/{session_id}").json()["deleted"] is True
        assert client.get(f"{BASE}/{session_id}").status_code == 404


@pytest.mark.parametrize(("min_length", "status"), [(1000, 200), (1001, 400), (10**30, 400)])
def test_a_min_length_past_the_session_cap_is_refused(engine, min_length: int, status: int) -> None:
    """The decode of an on_min_length session would never start early: a session never holds more
    than the worker's cap. The refusal names the field and the cap."""
    client, _ = make_client(engine, max_payload_per_session=1000)
    with client:
        reply = client.post(BASE, json={"start_policy": "on_min_length", "min_length": min_length})
    assert reply.status_code == status, reply.text
    if status == 400:
        error = reply.json()["error"]
        assert error["param"] == "min_length" and error["type"] == "invalid_request_error"
        assert error["message"].endswith("this worker holds at most 1000 a session"), error["message"]


def test_idle_timeout_releases_the_session(engine) -> None:
    client, server = make_client(engine, session_timeout_s=0.2)
    with client:
        session_id = client.post(BASE, json={}).json()["session_id"]
        client.post(f"{BASE}/{session_id}/chunks", json=text_chunk(0, "partial"))
        assert len(server.streaming.sessions) == 1
        time.sleep(1.5)
        assert client.get(f"{BASE}/{session_id}").status_code == 404
        assert len(server.streaming.sessions) == 0
        assert server.metrics.sessions.labels(kind="streaming_input")._value.get() == 0


def png(shade: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), shade, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def image_chunk(seq: int, shade: int, *, modality: str | None = "image", end: bool = False) -> dict:
    chunk = {"sequence_id": seq, "payload": base64.b64encode(png(shade)).decode(), "end_of_input": end}
    return chunk if modality is None else {**chunk, "modality": modality}


@pytest.mark.parametrize(
    ("policy", "media", "started", "prefetched"),
    [
        ("on_end_only", True, (False, False), 0),
        ("on_first_chunk", True, (True, True), 2),
        ("on_min_length", True, (False, True), 2),  # 100 bytes in order with the second PNG: both go
        ("on_first_chunk", False, (False, False), 0),  # text: nothing to encode ahead, nothing submitted
    ],
)
def test_start_policies_submit_media_ahead(
    engine, policy: str, media: bool, started: tuple, prefetched: int
) -> None:
    client, _ = make_client(engine)
    first_chunk = image_chunk(0, 10) if media else text_chunk(0, "ab")
    second_chunk = image_chunk(1, 20) if media else text_chunk(1, "cdef")
    with client:
        body = {"start_policy": policy, "min_length": 100 if media else 4}
        session_id = client.post(BASE, json=body).json()["session_id"]
        first = client.post(f"{BASE}/{session_id}/chunks", json=first_chunk).json()
        second = client.post(f"{BASE}/{session_id}/chunks", json=second_chunk).json()
        status = client.get(f"{BASE}/{session_id}").json()
        final = client.post(f"{BASE}/{session_id}/chunks", json=text_chunk(2, "g", end=True)).json()
    assert (first["started"], second["started"]) == started
    assert status["prefetched"] == prefetched == len(engine.prefetched)
    assert all(m.kind == "image" for batch in engine.prefetched for m in batch)
    assert final["started"] is True  # the request itself is submitted at the end


def ndjson(frames: list[dict]):
    for frame in frames:
        yield (json.dumps(frame) + "\n").encode()


def test_mode_a_ndjson_chat_completion(engine) -> None:
    client, server = make_client(engine)
    headers = {"X-Streaming-Input": "true", "content-type": "application/x-ndjson"}
    frames = [
        {"model": "scripted", "temperature": 0},
        {"modality": "text", "payload": base64.b64encode(b"Hi ").decode()},
        {"modality": "text", "text": "there", "end_of_input": True},
    ]
    with client:
        answer = client.post("/v1/chat/completions", content=ndjson(frames), headers=headers)
        assert answer.status_code == 200
        assert answer.json()["object"] == "chat.completion"
        assert answer.json()["choices"][0]["message"]["content"] == "turns1 w1 w2 w3"
        streamed = client.post(
            "/v1/chat/completions",
            content=ndjson([{**frames[0], "stream": True}, *frames[1:]]),
            headers=headers,
        )
        assert streamed.text.rstrip().endswith("data: [DONE]")
        bad = client.post(
            "/v1/chat/completions", content=b'{"modality": "text", "text": "x"}\n{oops\n', headers=headers
        )
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
        plain = client.post("/v1/chat/completions", json={"messages": []})
        assert plain.json() == {"route": "ordinary chat"}
    assert engine.requests[0].turns[0].text == "Hi there"
    assert len(server.streaming.sessions) <= 1  # the streamed one waits for the idle reaper
