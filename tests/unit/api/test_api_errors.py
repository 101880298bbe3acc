"""The error model: pydantic failures, media and engine errors become exact OpenAI error JSON."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import ValidationError

from omni_runtime.api.chat.protocol import ChatCompletionRequest
from omni_runtime.api.chat.transport import error_event, join_audio
from omni_runtime.api.errors import (
    ApiError,
    field_path,
    from_engine_error,
    from_media_error,
    from_validation_errors,
    install_error_handlers,
)
from omni_runtime.contract.engine import AudioChunk, EngineError
from omni_runtime.media.errors import MediaError


def _validation(body: Any) -> dict[str, Any]:
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate(body)
    error = from_validation_errors(caught.value.errors())
    return {"status": error.status, **error.detail.model_dump()}


def test_field_path_drops_body_and_union_tags() -> None:
    loc = (
        "body",
        "messages",
        0,
        "content",
        "list[tagged-union[TextPart,ImagePart]]",
        1,
        "type=image_url",
        "image_url",
    )
    assert field_path(loc) == "messages[0].content[1].image_url"
    assert field_path(("body",)) == ""
    assert field_path(("audio", "format")) == "audio.format"


def test_union_member_errors_merge_for_one_field() -> None:
    assert _validation({"messages": [{"role": "user", "content": 5}]}) == {
        "status": 400,
        "message": "Invalid value for 'messages[0].content': Input should be a valid string; or Input should be a "
        "valid list.",
        "type": "invalid_request_error",
        "param": "messages[0].content",
        "code": "invalid_type",
    }


def test_the_deeper_union_member_wins() -> None:
    body = {
        "messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"format": "wav"}}]}]
    }
    assert _validation(body) == {
        "status": 400,
        "message": "Missing required parameter: 'messages[0].content[0].input_audio.data'.",
        "type": "invalid_request_error",
        "param": "messages[0].content[0].input_audio.data",
        "code": "missing_required_parameter",
    }


def test_part_without_type() -> None:
    assert _validation({"messages": [{"role": "user", "content": [{"text": "x"}]}]}) == {
        "status": 400,
        "message": "Invalid value for 'messages[0].content[0]': the item has no \"type\" field saying what it is.",
        "type": "invalid_request_error",
        "param": "messages[0].content[0]",
        "code": "invalid_value",
    }


def test_media_error_names_its_field() -> None:
    error = from_media_error(MediaError("too big", code="media_too_large", param="images[0]", status=413))
    assert (error.status, error.detail.model_dump()) == (
        413,
        {
            "message": "images[0]: too big",
            "type": "invalid_request_error",
            "param": "images[0]",
            "code": "media_too_large",
        },
    )


def test_engine_refusal_keeps_its_message_and_a_fault_stays_generic() -> None:
    refusal = from_engine_error(EngineError("unknown voice 'x'", param="audio.voice"))
    assert (refusal.status, refusal.detail.param, refusal.detail.message) == (
        400,
        "audio.voice",
        "unknown voice 'x'",
    )
    fault = from_engine_error(EngineError("CUDA out of memory at 0x7f", status=500))
    assert fault.status == 500
    assert fault.detail.model_dump() == {
        "message": "The worker failed while serving this request; the details are in its log.",
        "type": "server_error",
        "param": None,
        "code": "internal_error",
    }


def test_sse_error_event_is_one_json_object() -> None:
    event = error_event(ApiError("nope", status=400, param="x", code="c"))
    assert event.startswith("data: ") and event.endswith("\n\n")
    assert json.loads(event[len("data: ") :]) == {
        "error": {"message": "nope", "type": "invalid_request_error", "param": "x", "code": "c"}
    }


def test_join_audio_keeps_the_first_chunk_rate() -> None:
    a = AudioChunk(pcm=[0.1, 0.2], sample_rate=24000)  # type: ignore[arg-type]
    b = AudioChunk(pcm=[0.3], sample_rate=24000)  # type: ignore[arg-type]
    pcm, rate = join_audio([a, b], fallback_rate=16000)
    assert rate == 24000 and pcm.tolist() == pytest.approx([0.1, 0.2, 0.3])
    empty, rate = join_audio([], fallback_rate=44100)
    assert (empty.size, rate) == (0, 44100)
    mixed, rate = join_audio([a, AudioChunk(pcm=[0.0] * 480, sample_rate=48000)], fallback_rate=1)  # type: ignore[arg-type]
    assert (mixed.size, rate) == (2 + 240, 24000)


async def test_handlers_on_a_real_app() -> None:
    """Starlette's own errors and a bug in a route all answer in the same JSON shape."""
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret internal detail")

    @app.get("/refuse")
    async def refuse() -> None:
        raise ApiError("no", status=413, param="p", code="c")

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        boom_reply = await client.get("/boom")
        refuse_reply = await client.get("/refuse")
        missing = await client.post("/nowhere")
    assert boom_reply.status_code == 500
    assert boom_reply.json() == {
        "error": {
            "message": "The worker failed while serving this request; the details are in its log.",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
        }
    }
    assert "secret" not in boom_reply.text
    assert refuse_reply.status_code == 413 and refuse_reply.json()["error"]["param"] == "p"
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
