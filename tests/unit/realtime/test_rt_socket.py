"""/v1/realtime over a real socket (uvicorn): the official openai client, beta dialect, resume, limits,
and the choice between the OpenAI and vLLM dialects."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from dataclasses import replace

import pytest
import uvicorn
import websockets
from fastapi import FastAPI
from openai import AsyncOpenAI
from rt_helpers import EnergyScorer, b64_pcm16, tone

from omni_runtime.realtime import RealtimeServer, RealtimeSettings
from omni_runtime.realtime.transcription.session import TranscriptionSession


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
async def served(engine):
    servers: list[tuple[uvicorn.Server, asyncio.Task]] = []

    async def serve(**overrides) -> tuple[str, RealtimeServer]:
        realtime = RealtimeServer(
            engine=engine, settings=RealtimeSettings(worker_id="w0", **overrides), scorer_factory=EnergyScorer
        )
        app = FastAPI()
        app.include_router(realtime.router())
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.02)
        servers.append((server, task))
        return f"127.0.0.1:{port}", realtime

    yield serve
    for server, task in servers:
        server.should_exit = True
        await task


async def until(conn, event_type: str) -> list:
    seen = []
    async for event in conn:
        seen.append(event)
        if event.type == event_type:
            return seen
    raise AssertionError(f"connection closed before {event_type}")


async def test_openai_client_two_turns_keep_history(served, engine) -> None:
    host, _ = await served()
    client = AsyncOpenAI(base_url=f"http://{host}/v1", api_key="unused")
    async with client.realtime.connect(model="scripted") as conn:
        created = await conn.recv()
        assert created.type == "session.created" and created.session.id.startswith("rt_w0.")
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["audio"],
                "audio": {"input": {"turn_detection": None}},
            }
        )
        await until(conn, "session.updated")
        for text in ("first question", "second question"):
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
            )
            await conn.response.create()
            events = await until(conn, "response.done")
            assert events[-1].response.status == "completed"
            assert any(e.type == "response.output_audio.delta" for e in events)
    assert [len(request.turns) for request in engine.requests] == [1, 3]
    assert engine.requests[1].turns[1].text == "turns1 w1 w2 w3"
    # Both turns name the session's conversation KV; the closed socket frees it (and its probes').
    session_id = created.session.id
    assert [request.session_key for request in engine.requests] == [session_id, session_id]
    await settle(lambda: session_id in engine.ended_sessions)
    assert engine.ended_sessions == [session_id, f"{session_id}/probe"]


async def test_beta_clients_get_beta_event_names(served) -> None:
    host, _ = await served()
    async with websockets.connect(
        f"ws://{host}/v1/realtime?model=x", additional_headers={"OpenAI-Beta": "realtime=v1"}
    ) as ws:
        created = json.loads(await ws.recv())
        assert created["session"]["modalities"] == ["text", "audio"]
        await ws.send(
            json.dumps(
                {"type": "session.update", "session": {"turn_detection": None, "modalities": ["text"]}}
            )
        )
        await ws.send(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "hi"}],
                    },
                }
            )
        )
        await ws.send(json.dumps({"type": "response.create"}))
        types = []
        while not types or types[-1] != "response.done":
            types.append(json.loads(await ws.recv())["type"])
    assert "conversation.item.created" in types and "response.text.delta" in types
    assert not [t for t in types if t.startswith(("response.output_text", "response.output_audio"))]


async def test_duplex_session_resumes_with_replay(served, engine) -> None:
    engine.step_s = 0.02
    engine.words = 6
    host, realtime = await served(resume_grace_s=5)
    ws = await websockets.connect(f"ws://{host}/v1/realtime?duplex=1")
    created = json.loads(await ws.recv())
    token = created["session"]["id"]
    await ws.send(
        json.dumps(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "hi"}],
                },
            }
        )
    )
    await ws.send(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"]}}))
    last = None
    while True:
        event = json.loads(await ws.recv())
        last = event["event_id"]
        if event["type"] == "response.output_text.delta":
            break
    ws.transport.abort()  # the network drops: no close frame
    await asyncio.sleep(0.3)  # the response finishes while nobody listens
    assert realtime.sessions.get(token) is not None
    async with websockets.connect(
        f"ws://{host}/v1/realtime?duplex=1&session_id={token}&last_event_id={last}"
    ) as again:
        replay = []
        while not replay or replay[-1]["type"] != "session.resumed":
            replay.append(json.loads(await again.recv()))
        types = [event["type"] for event in replay]
        assert types[-1] == "session.resumed" and replay[-1]["replay_complete"] is True
        assert "response.done" in types
        text = "".join(e["delta"] for e in replay if e["type"] == "response.output_text.delta")
        assert text == " w1 w2 w3 w4 w5"  # everything after the first delta, nothing twice
    async with websockets.connect(
        f"ws://{host}/v1/realtime?duplex=1&session_id=rt_w0.unknownsession"
    ) as stale:
        refused = json.loads(await stale.recv())
        assert refused["error"]["code"] == "session_not_found"


async def test_session_limit_and_idle_limit_answer_with_error_events(served) -> None:
    host, realtime = await served(max_realtime_sessions=1, session_idle_timeout_s=0.5)
    async with websockets.connect(f"ws://{host}/v1/realtime") as first:
        await first.recv()
        async with websockets.connect(f"ws://{host}/v1/realtime") as second:
            refused = json.loads(await second.recv())
            assert refused["error"]["code"] == "session_limit_reached"
            with contextlib.suppress(websockets.ConnectionClosed):
                await second.recv()
            assert second.close_code == 1013
        expired = json.loads(await asyncio.wait_for(first.recv(), timeout=5))
        assert expired["error"]["code"] == "session_expired"
    await asyncio.sleep(0.1)
    assert len(realtime.sessions) == 0


async def test_latency_probe_measures_every_turn(served) -> None:
    from omni_runtime.bench.realtime_latency import Probe, measure, synthetic_speech

    host, _ = await served()
    probe = Probe(url=f"ws://{host}/v1/realtime", speech=synthetic_speech(0.3), turns=2, max_output_tokens=3)
    report = await measure(probe, concurrency=2)
    assert report["samples"] == 4 and report["concurrency"] == 2
    assert len(report["latencies_s"]) == 4 and max(report["latencies_s"]) == report["max_s"]
    assert 0 <= report["median_s"] <= report["p90_s"] <= report["max_s"] < 5
    assert [(row["turn_index"], row["samples"]) for row in report["by_turn"]] == [(1, 2), (2, 2)]
    assert all(row["median_s"] <= row["max_s"] <= report["max_s"] for row in report["by_turn"])


async def test_a_paced_probe_sends_its_speech_in_real_time(served) -> None:
    """``--paced``: 0.5 s of speech goes out as five 0.1 s pieces 0.1 s apart (0.5 s of waiting
    before the commit that an unpaced turn does not have)."""
    from omni_runtime.bench.realtime_latency import Probe, measure, synthetic_speech

    host, _ = await served()
    probe = Probe(url=f"ws://{host}/v1/realtime", speech=synthetic_speech(0.5), turns=1, max_output_tokens=2)
    began = time.monotonic()
    await measure(probe, concurrency=1)
    at_once = time.monotonic() - began
    began = time.monotonic()
    report = await measure(replace(probe, paced=True), concurrency=1)
    paced = time.monotonic() - began
    assert report["samples"] == 1
    assert paced >= 0.5 and paced - at_once > 0.3, (paced, at_once)


# --- vLLM's transcription dialect on the same endpoint --------------------------------------------


async def settle(condition, *, within: float = 5.0) -> None:
    """Wait (bounded) for server-side state the socket close sets in motion."""
    deadline = asyncio.get_running_loop().time() + within
    while not condition() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    assert condition()


async def next_of(ws, event_type: str) -> dict:
    while (event := json.loads(await ws.recv()))["type"] != event_type:
        assert event["type"] != "error", event
    return event


def vllm_append(ms: int) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": b64_pcm16(tone(ms, rate=16_000))})


async def test_the_first_event_picks_the_dialect(served, engine) -> None:
    host, realtime = await served()
    gauge = realtime.metrics.sessions.labels(kind="realtime")
    async with websockets.connect(f"ws://{host}/v1/realtime") as ws:
        created = json.loads(await ws.recv())
        # Undecided: both dialects' fields, so either client finds what it waits for.
        assert created["id"] == created["session"]["id"] and isinstance(created["created"], int)
        await ws.send(json.dumps({"type": "session.update", "model": "scripted", "max_tokens": 2}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        await ws.send(vllm_append(200))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        done = await next_of(ws, "transcription.done")
        assert done["text"] == "turns1 w1" and done["usage"]["total_tokens"] == 12
        assert isinstance(realtime.sessions.get(created["id"]), TranscriptionSession)
        assert gauge._value.get() == 1
    await settle(lambda: gauge._value.get() == 0 and len(realtime.sessions) == 0)

    # The same first event with an OpenAI "session" object stays OpenAI.
    async with websockets.connect(f"ws://{host}/v1/realtime") as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime"}}))
        assert (await next_of(ws, "session.updated"))["session"]["type"] == "realtime"
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        refused = json.loads(await ws.recv())
        assert refused["error"]["code"] == "input_audio_buffer_commit_empty"


async def test_protocol_parameter_names_the_dialect(served, engine) -> None:
    host, realtime = await served()
    async with websockets.connect(f"ws://{host}/v1/realtime?protocol=vllm") as ws:
        created = json.loads(await ws.recv())
        assert set(created) == {"type", "event_id", "id", "created"}
        await ws.send(vllm_append(200))  # an append first: OpenAI would have kept it too, so it is named
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        assert (await next_of(ws, "transcription.done"))["text"] == "turns1 w1 w2 w3"
    async with websockets.connect(f"ws://{host}/v1/realtime?protocol=openai") as ws:
        created = json.loads(await ws.recv())
        assert "id" not in created and created["session"]["id"]
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        assert json.loads(await ws.recv())["error"]["code"] == "input_audio_buffer_commit_empty"
    for query, says in (("protocol=grpc", "unknown protocol"), ("protocol=vllm&duplex=1", "duplex")):
        async with websockets.connect(f"ws://{host}/v1/realtime?{query}") as ws:
            refused = json.loads(await ws.recv())
            assert refused["error"]["param"] == "protocol" and says in refused["error"]["message"]
            with contextlib.suppress(websockets.ConnectionClosed):
                await ws.recv()
            assert ws.close_code == 1008
    await settle(lambda: len(realtime.sessions) == 0)


async def test_vllm_sessions_count_in_the_limit_and_are_released_mid_step(served, engine) -> None:
    engine.step_s = 0.05
    host, realtime = await served(max_realtime_sessions=1)
    gauge = realtime.metrics.sessions.labels(kind="realtime")
    async with websockets.connect(f"ws://{host}/v1/realtime") as first:
        await first.recv()
        await first.send(json.dumps({"type": "input_audio_buffer.commit"}))
        async with websockets.connect(f"ws://{host}/v1/realtime?protocol=vllm") as second:
            refused = json.loads(await second.recv())
            assert refused == {
                "type": "error",
                "error": refused["error"],
                "code": "session_limit_reached",
                "param": None,
            }
        await first.send(vllm_append(200))
        await first.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        await next_of(first, "transcription.delta")  # a step is running when the client leaves
    await settle(lambda: gauge._value.get() == 0 and engine.cancelled == [engine.requests[0].request_id])
    assert realtime.metrics.sessions_refused.labels(kind="realtime")._value.get() == 1
