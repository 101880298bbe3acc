"""Bad event fields found by an audit of the socket protocols, sent through the router to the live
worker: each is an ``error`` event naming the field and the session goes on, where before it was an
``internal_error`` event (a traceback in the log), a socket closed without any event, or a video
query whose huge ``top_k`` failed the thinker step of every request batched with it.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

from conftest import LiveWorker

USER_ITEM = {
    "type": "conversation.item.create",
    "item": {
        "id": "u1",
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "hi"}],
    },
}


def _invalid(param: str, message: str) -> dict[str, Any]:
    return {
        "type": "invalid_request_error",
        "code": "invalid_value",
        "message": f"{param}: {message}",
        "param": param,
    }


def _next(ws: ClientConnection, kind: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        event = json.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic())))
        if event["type"] == kind:
            return event


def _realtime_error(live: LiveWorker, *events: dict[str, Any] | str) -> dict[str, Any]:
    """The first ``error`` event after ``events``; the session must answer a session.update after it."""
    with connect(f"ws://{live.router_host}/v1/realtime", max_size=None) as ws:
        _next(ws, "session.created")
        for event in events:
            ws.send(event if isinstance(event, str) else json.dumps(event))
        error = _next(ws, "error")
        ws.send(json.dumps({"type": "session.update", "session": {"instructions": "Be brief."}}))
        assert _next(ws, "session.updated")["session"]["instructions"] == "Be brief."
    return error


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        pytest.param(
            [{"type": "response.create", "response": {"audio": "loud"}}],
            _invalid("response.audio", 'expected an object, such as {"output": {"voice": "alloy"}}'),
            id="response-audio-not-an-object",
        ),
        pytest.param(
            [{"type": "response.create", "response": {"max_output_tokens": 10**30}}],
            _invalid("response.max_output_tokens", f"expected an integer from 1 to 1000000, got {10**30!r}"),
            id="response-max-output-tokens-past-the-sessions-bound",
        ),
        pytest.param(
            [{"type": "response.create", "response": {"audio": {"output": 5}}}],
            _invalid("response.audio.output", 'expected an object, such as {"voice": "alloy"}'),
            id="response-audio-output-not-an-object",
        ),
        pytest.param(
            [
                {
                    "type": "session.update",
                    "session": {"turn_detection": {"type": "server_vad", "eagerness": ["high"]}},
                }
            ],
            _invalid("session.turn_detection.eagerness", "expected one of low, medium, auto, high"),
            id="eagerness-a-list",
        ),
        *(
            pytest.param(
                [USER_ITEM, f'{{"type": "playback.ack", "item_id": "u1", "{field}": {number}}}'],
                _invalid(field, "expected the played position in milliseconds (a finite number >= 0)"),
                id=f"{field}-{number}",
            )
            # JSON numbers Python reads as infinity or NaN
            for field, number in (("played_ms", "Infinity"), ("played_ms", "1e400"), ("audio_end_ms", "NaN"))
        ),
    ],
)
def test_realtime_bad_fields_are_error_events(
    live: LiveWorker, events: list[dict[str, Any] | str], expected: dict[str, Any]
) -> None:
    assert _realtime_error(live, *events)["error"] == expected


def test_a_first_event_nested_too_deep_is_an_error_event_not_a_dropped_socket(live: LiveWorker) -> None:
    error = _realtime_error(live, "[" * 100_000)["error"]
    assert error["message"].startswith("the message is not valid JSON: maximum recursion depth exceeded"), (
        error
    )
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "invalid_json", None)


@pytest.mark.parametrize(
    ("config", "param"),
    [
        ({"sampling_params_list": [{"top_k": 2**31}]}, "sampling_params_list[0].top_k"),
        ({"stage_params": {"talker": {"top_k": 10**20}}}, "stage_params.talker.top_k"),
    ],
)
def test_video_top_k_past_int64_is_an_error_event(
    live: LiveWorker, config: dict[str, Any], param: str
) -> None:
    with connect(f"ws://{live.router_host}/v1/video/chat/stream", max_size=None) as ws:
        ws.send(json.dumps({"type": "session.config", "config": {"modalities": ["text"], **config}}))
        error = _next(ws, "error")
        message = f"{param}: Input should be less than or equal to 2147483647"
        assert error["error"] == {
            "type": "invalid_request_error",
            "code": "invalid_value",
            "message": message,
            "param": param,
        }
        ws.send(json.dumps({"type": "ping"}))
        _next(ws, "pong")
