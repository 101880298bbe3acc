"""Streaming video: config aliases, near-duplicate filter, eviction, caps, and the socket protocol."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from PIL import Image
from rt_scripted_engine import ScriptedEngine

from omni_runtime.media.limits import MediaLimits
from omni_runtime.realtime import RealtimeServer, RealtimeSettings
from omni_runtime.realtime.errors import ProtocolError
from omni_runtime.realtime.video.state import VideoBuffer, VideoConfig


def frame_png(seed: int, *, size: tuple[int, int] = (64, 48), noise: float = 0.0) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    if noise:
        pixels = np.clip(pixels + rng.normal(0, noise, pixels.shape), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_config_accepts_legacy_aliases() -> None:
    config = VideoConfig.model_validate({"num_sample_frames": 8, "evs_enabled": False, "evs_threshold": 0.8})
    assert (config.num_frames, config.enable_frame_filter, config.frame_filter_threshold) == (8, False, 0.8)
    assert VideoConfig.model_validate({}).max_frames == 50


def test_filter_drops_near_duplicates_and_keeps_changes() -> None:
    buffer = VideoBuffer(limits=MediaLimits(), max_bytes=1 << 30, max_audio_seconds=10)
    config = VideoConfig(max_frames=10, frame_filter_threshold=0.95)
    outcomes = [buffer.add_frame(frame_png(seed), config=config).outcome for seed in (1, 1, 2, 2, 1)]
    assert outcomes == ["kept", "filtered", "kept", "filtered", "kept"]
    strict = VideoConfig(max_frames=10, frame_filter_threshold=1.0)  # higher keeps more: only exact copies go
    assert buffer.add_frame(frame_png(1), config=strict).outcome == "filtered"
    off = VideoConfig(max_frames=10, enable_frame_filter=False)
    assert buffer.add_frame(frame_png(1), config=off).outcome == "kept"
    assert buffer.stats()["frames_filtered"] == 3


def test_eviction_past_max_frames_and_byte_cap() -> None:
    buffer = VideoBuffer(limits=MediaLimits(), max_bytes=1 << 30, max_audio_seconds=10)
    config = VideoConfig(max_frames=3)
    evicted = [buffer.add_frame(frame_png(seed), config=config).evicted for seed in range(5)]
    assert evicted == [0, 0, 0, 1, 1]
    assert len(buffer.frames) == 3 and buffer.evicted == 2
    assert buffer.sample_frames(4).shape == (2, 48, 64, 3)  # even count, spread over the buffer
    tight = VideoBuffer(limits=MediaLimits(), max_bytes=64 * 48 * 3 * 2, max_audio_seconds=10)
    tight.add_frame(frame_png(1), config=config)
    tight.add_frame(frame_png(2), config=config)
    with pytest.raises(ProtocolError) as full:
        tight.add_frame(frame_png(3), config=config)
    assert full.value.code == "video_buffer_full"


def test_frames_are_scaled_to_the_first_frame_size_and_audio_overflow_clears() -> None:
    buffer = VideoBuffer(limits=MediaLimits(), max_bytes=1 << 30, max_audio_seconds=1.0)
    config = VideoConfig(enable_frame_filter=False)
    buffer.add_frame(frame_png(1, size=(64, 48)), config=config)
    buffer.add_frame(frame_png(2, size=(128, 96)), config=config)
    assert {frame.shape for frame in buffer.frames} == {(48, 64, 3)}
    buffer.add_audio(np.zeros(12_000, np.float32))
    buffer.add_audio(np.zeros(4_000, np.float32))  # exactly the cap: still fits
    with pytest.raises(ProtocolError) as overflow:
        buffer.add_audio(np.zeros(1, np.float32))
    assert (overflow.value.code, overflow.value.param) == ("audio_buffer_full", "data")
    assert buffer.audio.size == 0  # cleared, as vLLM-Omni does: the next query hears nothing older
    buffer.add_audio(np.ones(800, np.float32))
    turn = buffer.query_turn("q", config=config)
    assert [m.kind for m in turn.media] == ["video", "audio"] and turn.media[1].data.size == 800
    assert buffer.audio.size == 0  # the query took the audio


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_video_socket_filters_evicts_answers_and_reports_errors(engine) -> None:
    server = RealtimeServer(engine=engine, settings=RealtimeSettings(worker_id="w0"))
    app = FastAPI()
    app.include_router(server.router())
    with TestClient(app) as client, client.websocket_connect("/v1/video/chat/stream") as ws:
        ws.send_json(
            {"type": "session.config", "num_sample_frames": 2, "max_frames": 3, "modalities": ["text"]}
        )
        for seed in (1, 1, 2, 3, 4, 4):
            ws.send_json({"type": "video.frame", "data": _b64(frame_png(seed))})
        ws.send_json({"type": "audio.chunk", "data": _b64(np.zeros(1600, "<i2").tobytes())})
        ws.send_text("{broken")
        ws.send_json({"type": "video.frame", "data": "@@@"})
        ws.send_json({"type": "video.frame", "data": _b64(b"not an image")})
        ws.send_json({"type": "video.rewind"})
        ws.send_json({"type": "session.config", "max_frames": 0})
        ws.send_json({"type": "video.query", "text": "what happens?"})
        ws.send_json({"type": "video.query", "text": "and then?"})
        ws.send_json({"type": "video.done"})
        events = []
        while not events or events[-1]["type"] != "session.done":
            events.append(json.loads(ws.receive_text()))
    errors = [event["error"]["code"] for event in events if event["type"] == "error"]
    assert errors == [
        "invalid_json",
        "invalid_base64",
        "invalid_media",
        "unknown_event_type",
        "invalid_value",
    ]
    starts = [event for event in events if event["type"] == "response.start"]
    assert starts[0]["stats"] == {
        "frames_received": 6,
        "frames_kept": 4,
        "frames_filtered": 2,
        "frames_evicted": 1,
        "frames_buffered": 3,
        "audio_buffered_s": 0.1,
    }
    texts = [event["text"] for event in events if event["type"] == "response.text.done"]
    assert texts == ["turns1 w1 w2 w3", "turns3 w1 w2 w3"]  # the second query sees the first Q and A
    first = engine.requests[0].turns[-1]
    assert [m.kind for m in first.media] == ["video", "audio"]
    assert first.media[0].data.shape == (2, 48, 64, 3)
    assert events[-1]["stats"]["frames_kept"] == 4
    # Both queries name the session's conversation KV; the closed socket frees it.
    (key,) = {request.session_key for request in engine.requests}
    assert key is not None and engine.ended_sessions == [key]


def test_a_worker_fault_is_a_server_error_without_its_details_and_the_session_goes_on() -> None:
    engine = ScriptedEngine(fault="RuntimeError: padding (200, 200) at dimension 2 of input [1, 1, 160]")
    server = RealtimeServer(engine=engine, settings=RealtimeSettings(worker_id="w0"))
    app = FastAPI()
    app.include_router(server.router())
    with TestClient(app) as client, client.websocket_connect("/v1/video/chat/stream") as ws:
        ws.send_json({"type": "session.config", "modalities": ["text"]})
        ws.send_json({"type": "video.frame", "data": _b64(frame_png(1))})
        ws.send_json({"type": "video.query", "text": "what happens?"})
        ws.send_json({"type": "video.done"})
        events = []
        while not events or events[-1]["type"] != "session.done":
            events.append(json.loads(ws.receive_text()))
    (error,) = [event["error"] for event in events if event["type"] == "error"]
    assert error == {
        "type": "server_error",
        "code": "engine_error",
        "message": "the engine failed this query; the details are in the worker log; the session goes on, send "
        "another video.query",
        "param": None,
    }
    assert [event["status"] for event in events if event["type"] == "response.done"] == ["failed"]
