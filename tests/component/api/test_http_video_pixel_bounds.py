"""``stage_params.preprocessing.video_min_pixels`` / ``video_max_pixels``: the processor's per-frame
pixel bounds, per request, for both model families.

A value that is not a whole number >= 1, or a minimum above the maximum, is a 400 with OpenAI error
JSON naming the field (it was a bare ``int()`` in the Qwen2.5-Omni adapter: a ValueError, a 500 and
a traceback; the Qwen3-Omni adapter ignored the fields). Good values are parsed and reach the
processor: the prompt's video tokens follow them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from api_media import data_uri, mp4_bytes

from conftest import Worker
from omni_runtime.contract.engine import ChatTurn, EngineError, GenerationRequest
from omni_runtime.models.common import video_pixel_bounds

MIN = "stage_params.preprocessing.video_min_pixels"
MAX = "stage_params.preprocessing.video_max_pixels"


def _not_pixels(field: str, shown: str) -> str:
    return (
        f"{field} must be a whole number of pixels per video frame >= 1, not {shown}; "
        "send an integer such as 200704, or leave it out"
    )


def _unordered(low: int, high: int) -> str:
    return f"{MIN} ({low}) must not exceed {MAX} ({high}); lower the minimum or raise the maximum"


BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"video_min_pixels": "abc"}, MIN, _not_pixels(MIN, "'abc'")),
    ({"video_max_pixels": "abc"}, MAX, _not_pixels(MAX, "'abc'")),
    ({"video_min_pixels": [200704]}, MIN, _not_pixels(MIN, "[200704]")),
    ({"video_max_pixels": {"pixels": 1}}, MAX, _not_pixels(MAX, "{'pixels': 1}")),
    ({"video_min_pixels": -5}, MIN, _not_pixels(MIN, "-5")),
    ({"video_max_pixels": 0}, MAX, _not_pixels(MAX, "0")),
    ({"video_min_pixels": 2.5}, MIN, _not_pixels(MIN, "2.5")),
    ({"video_max_pixels": 3136.0}, MAX, _not_pixels(MAX, "3136.0")),
    ({"video_min_pixels": True}, MIN, _not_pixels(MIN, "True")),
    ({"video_max_pixels": None}, MAX, _not_pixels(MAX, "None")),
    ({"video_min_pixels": ""}, MIN, _not_pixels(MIN, "''")),
    ({"video_max_pixels": "1e6"}, MAX, _not_pixels(MAX, "'1e6'")),
    ({"video_max_pixels": "-1"}, MAX, _not_pixels(MAX, "'-1'")),
    ({"video_min_pixels": 100, "video_max_pixels": 10}, MIN, _unordered(100, 10)),
    ({"video_min_pixels": "200705", "video_max_pixels": 200704}, MIN, _unordered(200705, 200704)),
    ({"video_min_pixels": "x", "video_max_pixels": 1}, MIN, _not_pixels(MIN, "'x'")),  # first field first
]
GOOD: list[tuple[dict[str, Any], dict[str, int]]] = [
    ({}, {}),
    ({"video_min_pixels": 1}, {"min_pixels": 1}),
    ({"video_max_pixels": 200704}, {"max_pixels": 200704}),
    ({"video_max_pixels": "200704"}, {"max_pixels": 200704}),  # a numeral string, as stage_params.talker
    ({"video_min_pixels": " 3136 "}, {"min_pixels": 3136}),
    ({"video_min_pixels": 3136, "video_max_pixels": 3136}, {"min_pixels": 3136, "max_pixels": 3136}),
    ({"video_min_pixels": 3136, "video_max_pixels": "12544"}, {"min_pixels": 3136, "max_pixels": 12544}),
    ({"video_fps": "ignored"}, {}),  # other keys are not this helper's
]


CONTEXT = 2048  # tokens; the tiny Qwen2.5 processor's video frames have 28 x 28 pixels a token
MOST = CONTEXT * 28 * 28  # 1605632: the largest minimum one frame of that context allows


def _too_big(value: int) -> str:
    return (
        f"{MIN} ({value}) would make every video frame at least {value // 784} tokens, more than this "
        f"model's {CONTEXT}-token context; send at most {MOST}"
    )


TOO_BIG: list[tuple[dict[str, Any], str, str]] = [
    ({"video_min_pixels": MOST + 1}, MIN, _too_big(MOST + 1)),
    ({"video_min_pixels": 10**9}, MIN, _too_big(10**9)),  # would upscale each frame to 1e9 pixels
    ({"video_min_pixels": 10**9, "video_max_pixels": 10**9}, MIN, _too_big(10**9)),
]


@pytest.fixture(scope="module")
def processor(tiny_checkpoint: Path) -> Any:
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_checkpoint)


def _request(preprocessing: dict[str, Any]) -> GenerationRequest:
    return GenerationRequest(
        request_id="r",
        turns=(ChatTurn(role="user", text="hi"),),
        stage_params={"preprocessing": preprocessing},
    )


@pytest.mark.parametrize(("preprocessing", "param", "message"), BAD + TOO_BIG)
def test_bad_bounds_are_refused_naming_the_field(
    processor: Any, preprocessing: dict[str, Any], param: str, message: str
) -> None:
    with pytest.raises(EngineError) as err:
        video_pixel_bounds(_request(preprocessing), processor, CONTEXT)
    assert (str(err.value), err.value.param, err.value.status) == (message, param, 400)


@pytest.mark.parametrize(
    ("preprocessing", "bounds"), [*GOOD, ({"video_min_pixels": MOST}, {"min_pixels": MOST})]
)
def test_good_bounds_are_parsed(
    processor: Any, preprocessing: dict[str, Any], bounds: dict[str, int]
) -> None:
    assert video_pixel_bounds(_request(preprocessing), processor, CONTEXT) == bounds


def test_no_preprocessing_params_means_the_processor_defaults(processor: Any) -> None:
    request = GenerationRequest(request_id="r", turns=(ChatTurn(role="user", text="hi"),))
    assert video_pixel_bounds(request, processor, CONTEXT) == {}


# --- through HTTP, on each model family's worker ---------------------------------------------

VIDEO = data_uri("video/mp4", mp4_bytes(frames=4, fps=4, width=64, height=48))


def _body(preprocessing: dict[str, Any] | None, *, video: bool = True, **extra: Any) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": "What is this?"}]
    if video:
        content.insert(0, {"type": "video_url", "video_url": {"url": VIDEO}})
    body: dict[str, Any] = {"messages": [{"role": "user", "content": content}], "max_tokens": 1, **extra}
    if preprocessing is not None:
        body["stage_params"] = {"preprocessing": preprocessing}
    return body


def _post(worker: Worker, body: dict[str, Any]) -> tuple[int, Any]:
    with worker.client() as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.headers["content-type"] == "application/json", response.text
    return response.status_code, response.json()


def _openai_error(message: str, param: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}


@pytest.mark.parametrize(("preprocessing", "param", "message"), BAD)
def test_bad_bounds_are_a_400_naming_the_field(
    speech_worker: Worker, preprocessing: dict[str, Any], param: str, message: str
) -> None:
    assert _post(speech_worker, _body(preprocessing)) == (400, _openai_error(message, param))


@pytest.mark.parametrize(
    ("video", "stream"), [(False, False), (True, True)], ids=["text-only", "video-streamed"]
)
def test_bad_bounds_are_refused_with_or_without_a_video(
    speech_worker: Worker, video: bool, stream: bool
) -> None:
    body = _body({"video_min_pixels": "abc"}, video=video, stream=stream)
    assert _post(speech_worker, body) == (400, _openai_error(_not_pixels(MIN, "'abc'"), MIN))


def test_a_minimum_past_the_context_is_a_400_before_any_frame_is_upscaled(speech_worker: Worker) -> None:
    status, body = _post(speech_worker, _body({"video_min_pixels": 10**9}))
    assert status == 400 and body["error"]["param"] == MIN
    assert "more than this model's" in body["error"]["message"] and "send at most" in body["error"]["message"]


def test_good_bounds_reach_the_processor(speech_worker: Worker) -> None:
    def prompt_tokens(preprocessing: dict[str, Any] | None) -> int:
        status, body = _post(speech_worker, _body(preprocessing))
        assert status == 200, body
        return int(body["usage"]["prompt_tokens"])

    default = prompt_tokens(None)
    # The tiny processors' default minimum upscales the 64x48 frames; a lower one keeps them small.
    small = prompt_tokens({"video_min_pixels": 3136})
    assert small < default
    assert prompt_tokens({"video_min_pixels": 4 * 3136}) > small  # 4x the pixels, more video tokens
    assert prompt_tokens({"video_min_pixels": "3136", "video_max_pixels": "3136"}) <= small
