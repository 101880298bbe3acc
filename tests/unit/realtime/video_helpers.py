"""Helpers of the streaming video unit tests: a PNG frame, a whole session over a real socket."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import numpy as np
from fastapi import FastAPI
from fastapi.testclient import TestClient
from PIL import Image

from omni_runtime.realtime import RealtimeServer, RealtimeSettings


def png_b64(seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def run_video(engine: Any, events: list[dict[str, Any] | str], **settings: Any) -> list[dict[str, Any]]:
    """Send ``events`` (a str as it is) then video.done on a real socket; every server event until
    session.done. The session's slot must be free afterwards and the live-session gauge at 0."""
    server = RealtimeServer(engine=engine, settings=RealtimeSettings(worker_id="w0", **settings))
    app = FastAPI()
    app.include_router(server.router())
    received: list[dict[str, Any]] = []
    with TestClient(app) as client, client.websocket_connect("/v1/video/chat/stream") as ws:
        for event in [*events, {"type": "video.done"}]:
            ws.send_text(event if isinstance(event, str) else json.dumps(event))
        while not received or received[-1]["type"] != "session.done":
            received.append(json.loads(ws.receive_text()))
    assert not server.videos  # the slot is released
    assert server.metrics.registry.get_sample_value("omni_realtime_sessions", {"kind": "video"}) == 0
    return received


def errors_of(events: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(e["error"]["code"], e["error"]["param"]) for e in events if e["type"] == "error"]
