"""Streaming video: malformed fields in every event type, frame acks, and idle sessions.

Each malformed event gets one ``error`` event naming the field, the session stays usable (a good
query after it is answered), and the slot and the live-session gauge are released at the end.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from rt_scripted_engine import ScriptedEngine
from video_helpers import errors_of, png_b64, run_video

from omni_runtime.realtime import RealtimeServer, RealtimeSettings

ODD_PCM = base64.b64encode(b"\x00\x01\x02").decode()
FUZZ_CASES: list[tuple[dict[str, Any] | str, str, str | None]] = [
    ("{broken", "invalid_json", None),
    ("[" * 100_000, "invalid_json", None),  # nested too deep for the parser
    ("[1, 2]", "invalid_event", "type"),
    ({"type": 5}, "invalid_event", "type"),
    ({"type": "video.rewind"}, "unknown_event_type", "type"),
    ({"type": "session.config", "config": "fast"}, "invalid_value", "config"),
    ({"type": "session.config", "session": {"num_frames": []}}, "invalid_value", "num_frames"),
    ({"type": "video.frame"}, "missing_required_parameter", "data"),
    ({"type": "video.frame", "data": 12}, "invalid_base64", "data"),
    ({"type": "video.frame", "data": None}, "invalid_base64", "data"),
    ({"type": "video.frame", "data": "@@@"}, "invalid_base64", "data"),
    ({"type": "video.frame", "data": ""}, "invalid_media", "data"),
    (
        {"type": "video.frame", "data": base64.b64encode(b"GIF89a not really").decode()},
        "invalid_media",
        "data",
    ),
    ({"type": "video.frame", "data": "data:image/png;base64,@@"}, "invalid_base64", "data"),
    ({"type": "audio.chunk"}, "missing_required_parameter", "data"),
    ({"type": "audio.chunk", "data": ["AAAA"]}, "invalid_base64", "data"),
    ({"type": "audio.chunk", "data": ODD_PCM}, "invalid_audio", "data"),
    ({"type": "audio.chunk", "data": "AAAA", "sample_rate": "16000"}, "invalid_value", "sample_rate"),
    ({"type": "audio.chunk", "data": "AAAA", "sample_rate": 16000.0}, "invalid_value", "sample_rate"),
    ({"type": "audio.chunk", "data": "AAAA", "sample_rate": 8000}, "invalid_value", "sample_rate"),
    ({"type": "video.query", "text": 42}, "invalid_value", "text"),
    ({"type": "video.query", "text": ["what"]}, "invalid_value", "text"),
    ({"type": "video.query", "text": "\ud800"}, "invalid_value", "text"),
    ({"type": "video.query", "text": "x" * 200_000}, "prompt_too_long", "text"),
    ({"type": "video.query", "query": 3}, "invalid_value", "query"),
    ({"type": "video.query", "text": "hi", "audio_data": 1}, "invalid_value", "audio_data"),
    ({"type": "video.query", "text": "hi", "audio_data": "@@"}, "invalid_base64", "audio_data"),
    ({"type": "video.query", "text": "hi", "audio_data": ODD_PCM}, "invalid_audio", "audio_data"),
    (
        {"type": "video.query", "text": "hi", "sampling_params_list": "hot"},
        "invalid_value",
        "sampling_params_list",
    ),
    (
        {"type": "video.query", "text": "hi", "stage_params": {"talker": {"top_k": "1"}}},
        "invalid_value",
        "stage_params.talker.top_k",
    ),
]


@pytest.mark.parametrize(("event", "code", "param"), FUZZ_CASES)
def test_a_malformed_event_is_one_error_naming_the_field_and_the_session_goes_on(
    engine: ScriptedEngine, event: dict[str, Any] | str, code: str, param: str | None
) -> None:
    events = run_video(
        engine,
        [
            {"type": "session.config", "modalities": ["text"]},
            {"type": "video.frame", "data": png_b64(1)},
            event,
            {"type": "video.query", "text": "still there?"},
        ],
    )
    assert errors_of(events) == [(code, param)]
    assert [e["status"] for e in events if e["type"] == "response.done"] == ["completed"]
    assert len(engine.requests) == 1  # the malformed query (if any) was never asked


def test_frames_with_an_id_are_acknowledged(engine: ScriptedEngine) -> None:
    events = run_video(
        engine,
        [
            {"type": "session.config", "modalities": ["text"], "max_frames": 2},
            {"type": "video.frame", "data": png_b64(1), "frame_id": "f1", "pts_ms": 0},
            {
                "type": "video.frame",
                "data": png_b64(1),
                "frame_id": "f2",
                "pts_ms": 500,
                "capture_ts_ms": "x",
            },
            {"type": "video.frame", "data": png_b64(2)},
            {"type": "video.frame", "data": png_b64(3), "frame_id": "f4", "pts_ms": 1500.5},
        ],
    )
    acks = [{k: v for k, v in e.items() if k != "event_id"} for e in events if e["type"] == "video.frame.ack"]
    assert acks == [
        {"type": "video.frame.ack", "frame_id": "f1", "accepted": True, "buffered_frames": 1, "pts_ms": 0},
        {
            "type": "video.frame.ack",
            "frame_id": "f2",
            "accepted": False,
            "buffered_frames": 1,
            "pts_ms": 500,
            "reason": "filtered",
        },
        {
            "type": "video.frame.ack",
            "frame_id": "f4",
            "accepted": True,
            "buffered_frames": 2,
            "pts_ms": 1500.5,
        },
    ]


def test_a_non_finite_position_is_not_echoed(engine: ScriptedEngine) -> None:
    """Infinity or NaN back in the ack would not be strict JSON (a browser's JSON.parse refuses it)."""
    events = run_video(
        engine,
        [
            {"type": "session.config", "modalities": ["text"], "max_frames": 2},
            {
                "type": "video.frame",
                "data": png_b64(1),
                "frame_id": "f1",
                "pts_ms": math.inf,
                "capture_ts_ms": 7,
            },
            {"type": "video.frame", "data": png_b64(2), "frame_id": "f2", "pts_ms": math.nan},
        ],
    )
    acks = [e for e in events if e["type"] == "video.frame.ack"]
    assert [(a["frame_id"], a.get("pts_ms"), a.get("capture_ts_ms")) for a in acks] == [
        ("f1", None, 7),
        ("f2", None, None),
    ]
    json.dumps(acks, allow_nan=False)


def test_a_silent_session_is_closed_with_an_error_but_not_while_it_is_answered() -> None:
    engine = ScriptedEngine(step_s=0.3)  # each answer lasts longer than the idle timeout
    server = RealtimeServer(
        engine=engine, settings=RealtimeSettings(worker_id="w0", session_idle_timeout_s=0.2)
    )
    app = FastAPI()
    app.include_router(server.router())
    with TestClient(app) as client, client.websocket_connect("/v1/video/chat/stream") as ws:
        ws.send_json({"type": "session.config", "modalities": ["text"]})
        ws.send_json(
            {"type": "audio.chunk", "data": base64.b64encode(np.zeros(160, "<i2").tobytes()).decode()}
        )
        ws.send_json({"type": "video.query", "text": "slow one"})
        events = []
        while not events or events[-1]["type"] != "error":
            events.append(json.loads(ws.receive_text()))
    types = [e["type"] for e in events]
    assert types.count("response.done") == 1 and types.index("response.done") < types.index("error")
    assert events[-1]["error"]["code"] == "session_idle_timeout"
    assert not server.videos
    assert server.metrics.registry.get_sample_value("omni_realtime_sessions", {"kind": "video"}) == 0


def test_a_query_without_text_is_about_the_buffered_media(engine: ScriptedEngine) -> None:
    events = run_video(
        engine,
        [
            {"type": "session.config", "modalities": ["text"]},
            {"type": "video.query"},  # nothing to answer about yet
            {"type": "video.query", "text": "   "},
            {"type": "video.frame", "data": png_b64(1)},
            {"type": "video.query"},  # as vLLM-Omni: the frames are the question
        ],
    )
    assert errors_of(events) == [("missing_required_parameter", "text")] * 2
    assert [e["status"] for e in events if e["type"] == "response.done"] == ["completed"]
    (turn,) = engine.requests[0].turns
    assert turn.text == "" and [m.kind for m in turn.media] == ["video"]
