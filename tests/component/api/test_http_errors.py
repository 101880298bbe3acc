"""Every bad input gets its exact OpenAI error JSON and status — never a 422, a 500 or a traceback."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_media import data_uri, mp4_bytes, png_bytes, tone_wav

from conftest import Worker, make_engine, start_worker, tiny_settings
from omni_runtime.media.limits import MediaLimits

HELLO = [{"role": "user", "content": "Hi"}]


def _error(
    message: str, param: str | None, code: str | None, type_: str = "invalid_request_error"
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@pytest.fixture(scope="module")
def limited(media_dir: Path, tiny_checkpoint: Path) -> Iterator[Worker]:
    """A text-only worker with small limits, so every limit is cheap to hit."""
    limits = MediaLimits(
        max_bytes=30_000,
        max_audio_seconds=2.0,
        max_image_pixels=64 * 64,
        max_video_frames=4,
        allowed_local_media_path=str(media_dir),
    )
    yield from start_worker(
        engine=make_engine(tiny_checkpoint, pipeline="text"),
        settings=tiny_settings(tiny_checkpoint, media=limits, max_tokens_limit=64),
        media_dir=media_dir,
    )


def _post(worker: Worker, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
    with worker.client() as client:
        response = (
            client.post("/v1/chat/completions", json=body, **kwargs)
            if body is not None
            else client.post("/v1/chat/completions", **kwargs)
        )
    assert response.headers["content-type"] == "application/json"
    return response.status_code, response.json()


def _image(url: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]


def test_unknown_model_is_404(limited: Worker) -> None:
    model = limited.engine.model_name
    assert _post(limited, {"model": "gpt-5", "messages": HELLO}) == (
        404,
        _error(
            f"The model `gpt-5` does not exist on this worker; it serves `{model}`.",
            "model",
            "model_not_found",
        ),
    )


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"messages": HELLO, "temperature": "hot"},
            _error(
                "Invalid value for 'temperature': Input should be a valid number.",
                "temperature",
                "invalid_type",
            ),
        ),
        (
            {"messages": "Hi"},
            _error("Invalid value for 'messages': Input should be a valid list.", "messages", "invalid_type"),
        ),
        (
            {"messages": []},
            _error(
                "Invalid value for 'messages': messages must contain at least one message.",
                "messages",
                "invalid_value",
            ),
        ),
        (
            {"max_tokens": 5},
            _error("Missing required parameter: 'messages'.", "messages", "missing_required_parameter"),
        ),
        (
            {"messages": [{"role": "tool", "content": "x"}]},
            _error(
                "Invalid value for 'messages[0].role': Input should be 'system', 'developer', 'user' or 'assistant'.",
                "messages[0].role",
                "invalid_value",
            ),
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "audio", "audio": "x"}]}]},
            _error(
                "Invalid value for 'messages[0].content[0]': unknown type 'audio'; expected one of 'text', "
                "'image_url', 'input_audio', 'audio_url', 'video_url'.",
                "messages[0].content[0]",
                "invalid_value",
            ),
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            _error(
                "Missing required parameter: 'messages[0].content[0].image_url.url'.",
                "messages[0].content[0].image_url.url",
                "missing_required_parameter",
            ),
        ),
        (
            {"messages": HELLO, "max_tokens": 0},
            _error(
                "Invalid value for 'max_tokens': Input should be greater than or equal to 1.",
                "max_tokens",
                "invalid_value",
            ),
        ),
        (
            {"messages": HELLO, "max_tokens": 65},
            _error(
                "max_tokens is 65, above this worker's limit of 64; ask for fewer tokens.",
                "max_tokens",
                "max_tokens_too_large",
            ),
        ),
        (
            {"messages": HELLO, "max_completion_tokens": 100},
            _error(
                "max_completion_tokens is 100, above this worker's limit of 64; ask for fewer tokens.",
                "max_completion_tokens",
                "max_tokens_too_large",
            ),
        ),
        (
            {"messages": HELLO, "audio": {"format": "mp3"}, "modalities": ["text", "audio"]},
            _error(
                "Invalid value for 'audio.format': Input should be 'wav' or 'pcm16'.",
                "audio.format",
                "invalid_value",
            ),
        ),
        (
            {"messages": HELLO, "video_max_frames": 5},
            _error(
                "video_max_frames is 5, above this worker's limit of 4.", "video_max_frames", "invalid_value"
            ),
        ),
        (
            {"messages": HELLO, "stage_params": {"vocoder": {"steps": 4}}},
            _error(
                "stage_params names an unknown stage 'vocoder'; stages are audio_encoder, decode, image_encoder, "
                "mm_aggregate, preprocessing, segmenter, talker, talker_stream, thinker.",
                "stage_params.vocoder",
                "invalid_value",
            ),
        ),
        (
            {"messages": HELLO, "stage_params": {"thinker": {"ignore_eos": "false"}}},
            _error(
                "stage_params.thinker.ignore_eos must be true or false, not 'false'.",
                "stage_params.thinker.ignore_eos",
                "invalid_value",
            ),
        ),
        ({"messages": HELLO, "n": 2}, _error("Only n=1 is supported.", "n", "unsupported_value")),
    ],
)
def test_invalid_requests(limited: Worker, body: dict[str, Any], expected: dict[str, Any]) -> None:
    assert _post(limited, body) == (400, expected)


def test_body_that_is_not_json(limited: Worker) -> None:
    status, body = _post(limited, content=b"{not json", headers={"content-type": "application/json"})
    assert status == 400
    assert body["error"]["code"] == "invalid_json" and body["error"]["param"] is None
    assert body["error"]["message"].startswith("The request body is not valid JSON: ")


def test_body_that_is_a_json_list(limited: Worker) -> None:
    status, body = _post(limited, [1, 2])
    assert status == 400 and body["error"]["code"] == "invalid_type"


def test_audio_from_a_text_only_worker(limited: Worker) -> None:
    assert _post(limited, {"messages": HELLO, "modalities": ["text", "audio"]}) == (
        400,
        _error(
            'This worker serves text only (started with --text-only or --pipeline text); remove "audio" from '
            "modalities, or send the request to a speech worker.",
            "modalities",
            "audio_output_unavailable",
        ),
    )


def test_unreadable_image(limited: Worker) -> None:
    param = "messages[0].content[0].image_url.url"
    assert _post(limited, {"messages": _image(data_uri("image/png", b"not a png at all"))}) == (
        400,
        _error(
            f"{param}: the image could not be decoded: not a supported image (send PNG, JPEG, WebP, GIF or BMP)",
            param,
            "invalid_media",
        ),
    )


def test_image_over_the_pixel_cap(limited: Worker) -> None:
    param = "messages[0].content[0].image_url.url"
    assert _post(limited, {"messages": _image(data_uri("image/png", png_bytes(80, 60)))}) == (
        400,
        _error(
            f"{param}: the image is 80x60 = 4800 pixels; this worker accepts at most 4096 (downscale it, or raise "
            "--max-image-pixels)",
            param,
            "image_too_large",
        ),
    )


def test_oversized_media_is_413(limited: Worker) -> None:
    audio = {"data": base64.b64encode(tone_wav(seconds=1.0, sample_rate=16000)).decode()}  # 32 KB
    param = "messages[0].content[0].input_audio.data"
    status, body = _post(
        limited, {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": audio}]}]}
    )
    assert status == 413
    assert body == _error(
        f"{param}: the media is 32044 bytes; this worker accepts at most 30000 bytes per item (send a smaller file, "
        "or raise --max-media-bytes)",
        param,
        "media_too_large",
    )


def test_too_long_audio(limited: Worker) -> None:
    status, body = _post(
        limited,
        {"messages": HELLO, "audios": [data_uri("audio/wav", tone_wav(seconds=3.0, sample_rate=4000))]},
    )
    assert status == 400
    assert body == _error(
        "audios[0]: the audio is 3.0 s long; this worker accepts at most 2 s (trim it, or raise --max-audio-seconds)",
        "audios[0]",
        "audio_too_long",
    )


def test_unreadable_video_reports_the_first_bad_item(limited: Worker) -> None:
    good = data_uri("video/mp4", mp4_bytes(frames=2, fps=2, width=32, height=32))
    status, body = _post(
        limited, {"messages": HELLO, "videos": [good, data_uri("video/mp4", b"junk" * 10), "data:x"]}
    )
    assert status == 400
    assert body["error"]["param"] == "videos[1]" and body["error"]["code"] == "invalid_media"


def test_local_path_outside_the_allowed_directory(limited: Worker, tmp_path: Path) -> None:
    outside = tmp_path / "secret.png"
    outside.write_bytes(png_bytes())
    status, body = _post(limited, {"messages": HELLO, "images": [str(outside)]})
    assert status == 400
    assert body["error"]["code"] == "media_source_forbidden" and body["error"]["param"] == "images[0]"


def test_unreachable_media_url(limited: Worker) -> None:
    status, body = _post(limited, {"messages": HELLO, "images": ["http://127.0.0.1:9/cat.png"]})
    assert status == 400
    assert body["error"]["code"] == "media_fetch_failed" and body["error"]["param"] == "images[0]"


def test_unknown_route_and_method(limited: Worker) -> None:
    with limited.client() as client:
        missing = client.get("/v1/completions")
        wrong = client.get("/v1/chat/completions")
    routes = "this worker serves POST /v1/chat/completions, GET /v1/models, GET /health, GET /ready and GET /metrics."
    assert (missing.status_code, missing.json()) == (
        404,
        _error(f"No route for GET /v1/completions; {routes}", None, "not_found"),
    )
    assert (wrong.status_code, wrong.json()) == (
        405,
        _error(f"No route for GET /v1/chat/completions; {routes}", None, "method_not_allowed"),
    )


def test_unknown_voice_is_refused_by_the_engine(worker: Worker) -> None:
    body = {"messages": HELLO, "modalities": ["text", "audio"], "audio": {"voice": "Nobody"}}
    assert _post(worker, body) == (
        400,
        _error("unknown voice 'Nobody'; available: Chelsie, Ethan", "audio.voice", None),
    )
    status, streamed = _post(worker, {**body, "stream": True})
    assert status == 400 and streamed["error"]["param"] == "audio.voice"
