"""ChatCompletionRequest: what it accepts, what it refuses, and the exact GenerationRequest it builds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from omni_runtime.api.chat.protocol import ChatCompletionRequest, MediaRef
from omni_runtime.api.errors import ApiError
from omni_runtime.api.settings import ServingLimits
from omni_runtime.contract.engine import ChatTurn, GenerationRequest, MediaInput, SamplingParams
from omni_runtime.media.video import VideoOptions

LIMITS = ServingLimits(
    model_name="tiny",
    max_tokens_limit=512,
    default_max_tokens=2048,
    supports_audio_output=True,
    max_video_frames=8,
)


def _request(**body: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "Hi"}], **body})


def _refusal(request: ChatCompletionRequest, limits: ServingLimits = LIMITS) -> dict[str, Any]:
    with pytest.raises(ApiError) as caught:
        request.check(limits)
    return {"status": caught.value.status, **caught.value.detail.model_dump()}


def test_plain_text_request_converts_exactly() -> None:
    request = ChatCompletionRequest.model_validate(
        {
            "model": "tiny",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": None},
            ],
            "max_completion_tokens": 7,
            "max_tokens": 99,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 20,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "stop": "END",
            "seed": 3,
        }
    )
    request.check(LIMITS)
    assert request.to_generation_request(request_id="r1", media={}, limits=LIMITS) == GenerationRequest(
        request_id="r1",
        turns=(
            ChatTurn(role="system", text="Be brief."),
            ChatTurn(role="user", text="a\nb"),
            ChatTurn(role="assistant", text=""),
        ),
        sampling=SamplingParams(
            max_tokens=7,
            temperature=0.5,
            top_p=0.9,
            top_k=20,
            min_p=0.05,
            repetition_penalty=1.1,
            stop=("END",),
            seed=3,
        ),
        want_audio=False,
        voice=None,
        stream_audio=False,
        stage_params={},
    )


def test_defaults_speech_and_bench_fields() -> None:
    request = _request(
        modalities=["text", "audio"],
        audio={"voice": "Ethan", "format": "pcm16"},
        stream=True,
        ignore_eos=True,
        stage_params={"talker": {"max_tokens": 60}},
        stop=["a", "b"],
    )
    generation = request.to_generation_request(request_id="r2", media={}, limits=LIMITS)
    # No max_tokens: the worker default, capped by the limit.
    assert generation.sampling == SamplingParams(max_tokens=512, stop=("a", "b"), ignore_eos=True)
    assert (generation.want_audio, generation.voice, generation.stream_audio) == (True, "Ethan", True)
    assert generation.stage_params == {"talker": {"max_tokens": 60}}


def test_ignore_eos_through_thinker_stage_params() -> None:
    generation = _request(stage_params={"thinker": {"ignore_eos": True}}).to_generation_request(
        request_id="r", media={}, limits=LIMITS
    )
    assert generation.sampling.ignore_eos is True


def test_media_refs_in_request_order_with_field_paths() -> None:
    request = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {"role": "system", "content": "sys"},
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": "https://x/a.png"},
                        {"type": "input_audio", "input_audio": {"data": "QUJD", "format": "wav"}},
                        {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64,QUJD"}},
                        {"type": "video_url", "video_url": {"url": "/m/v.mp4"}},
                        {"type": "text", "text": "what?"},
                    ],
                },
            ],
            "images": ["/m/b.png"],
            "audios": ["/m/c.wav"],
            "videos": ["/m/d.mp4"],
        }
    )
    base = "messages[1].content"
    assert request.media_refs() == [
        MediaRef("image", "https://x/a.png", f"{base}[0].image_url.url", 1),
        MediaRef("audio", "QUJD", f"{base}[1].input_audio.data", 1, inline_base64=True),
        MediaRef("audio", "data:audio/wav;base64,QUJD", f"{base}[2].audio_url.url", 1),
        MediaRef("video", "/m/v.mp4", f"{base}[3].video_url.url", 1),
        MediaRef("image", "/m/b.png", "images[0]", 1),
        MediaRef("audio", "/m/c.wav", "audios[0]", 1),
        MediaRef("video", "/m/d.mp4", "videos[0]", 1),
    ]


def test_decoded_media_lands_on_its_turn() -> None:
    request = _request(images=["/m/a.png"])
    image = MediaInput(kind="image", data=np.zeros((2, 2, 3), dtype=np.uint8))
    generation = request.to_generation_request(request_id="r", media={"images[0]": image}, limits=LIMITS)
    assert generation.turns == (ChatTurn(role="user", text="Hi", media=(image,)),)


def test_video_options_map_one_to_one() -> None:
    request = _request(
        video_fps=1.5, video_max_frames=4, video_min_pixels=10, video_max_pixels=20, video_total_pixels=80
    )
    assert request.video_options() == VideoOptions(
        fps=1.5, max_frames=4, min_pixels=10, max_pixels=20, total_pixels=80
    )


@pytest.mark.parametrize(
    ("body", "limits", "expected"),
    [
        (
            {"model": "other"},
            LIMITS,
            {
                "status": 404,
                "message": "The model `other` does not exist on this worker; it serves `tiny`.",
                "type": "invalid_request_error",
                "param": "model",
                "code": "model_not_found",
            },
        ),
        (
            {"max_tokens": 513},
            LIMITS,
            {
                "status": 400,
                "message": "max_tokens is 513, above this worker's limit of 512; ask for fewer tokens.",
                "type": "invalid_request_error",
                "param": "max_tokens",
                "code": "max_tokens_too_large",
            },
        ),
        (
            {"modalities": ["text", "audio"]},
            ServingLimits("tiny", 512, 2048, supports_audio_output=False, max_video_frames=8),
            {
                "status": 400,
                "message": 'This worker serves text only (started with --text-only or --pipeline text); remove "audio" '
                "from modalities, or send the request to a speech worker.",
                "type": "invalid_request_error",
                "param": "modalities",
                "code": "audio_output_unavailable",
            },
        ),
        (
            {"tools": [{"type": "function"}]},
            LIMITS,
            {
                "status": 400,
                "message": "Tool calling is not supported by this worker.",
                "type": "invalid_request_error",
                "param": "tools",
                "code": "unsupported_value",
            },
        ),
        (
            {"logprobs": True},
            LIMITS,
            {
                "status": 400,
                "message": "logprobs are not supported by this worker.",
                "type": "invalid_request_error",
                "param": "logprobs",
                "code": "unsupported_value",
            },
        ),
    ],
)
def test_check_refusals_are_exact(
    body: dict[str, Any], limits: ServingLimits, expected: dict[str, Any]
) -> None:
    assert _refusal(_request(**body), limits) == expected


def test_top_level_media_without_a_user_message_is_refused() -> None:
    request = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "system", "content": "x"}], "images": ["/m/a.png"]}
    )
    assert _refusal(request)["param"] == "messages"


def test_model_may_be_omitted_and_unknown_fields_are_ignored() -> None:
    request = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "x", "name": "bob"}], "user": "u1", "frequency_penalty": 0}
    )
    request.check(LIMITS)
    assert request.model is None


@pytest.mark.parametrize(
    "body",
    [
        {"stop": ["a", ""]},
        {"video_min_pixels": 100, "video_max_pixels": 10},
        {"temperature": 2.5},
        {"top_p": 0},
        {"top_k": -2},
        {"video_fps": 0},
    ],
)
def test_out_of_range_values_fail_validation(body: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        _request(**body)
