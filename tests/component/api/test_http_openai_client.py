"""The official `openai` Python client against the worker: text, speech out and streaming."""

from __future__ import annotations

import base64
import io
import struct

import openai
import pytest
import soundfile as sf
from api_media import data_uri, mp4_bytes

from conftest import SHORT_SPEECH, Worker
from omni_runtime.models.qwen3_omni_moe.adapter import CODEC_WINDOWS

HELLO = [{"role": "user", "content": "Hello"}]


def _client(worker: Worker) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{worker.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _model(client: openai.OpenAI) -> str:
    models = client.models.list().data
    assert len(models) == 1
    return models[0].id


def test_text(worker: Worker) -> None:
    client = _client(worker)
    completion = client.chat.completions.create(model=_model(client), messages=HELLO, max_tokens=5)  # type: ignore[arg-type]
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert completion.usage is not None and 1 <= completion.usage.completion_tokens <= 5


def test_audio_output(speech_worker: Worker) -> None:
    """Both model families."""
    client = _client(speech_worker)
    completion = client.chat.completions.create(
        model=_model(client),
        messages=HELLO,  # type: ignore[arg-type]
        max_tokens=8,
        modalities=["text", "audio"],
        audio={"voice": "Chelsie", "format": "wav"},  # type: ignore[typeddict-item]
        extra_body={"stage_params": SHORT_SPEECH},
    )
    audio = completion.choices[0].message.audio
    assert audio is not None and audio.id and audio.expires_at > 0
    wav = base64.b64decode(audio.data)
    assert struct.unpack("<I", wav[24:28])[0] == 24000
    assert sf.info(io.BytesIO(wav)).samplerate == 24000


def test_streaming(worker: Worker) -> None:
    client = _client(worker)
    stream = client.chat.completions.create(
        model=_model(client),
        messages=HELLO,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},  # type: ignore[arg-type]
    )
    texts, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                texts.append(choice.delta.content)
            finish = choice.finish_reason or finish
    assert len(texts) >= 2
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens >= len(texts) - 1


def test_errors_surface_as_typed_exceptions(worker: Worker) -> None:
    client = _client(worker)
    try:
        client.chat.completions.create(model="no-such-model", messages=HELLO, max_tokens=2)  # type: ignore[arg-type]
    except openai.NotFoundError as exc:
        assert exc.status_code == 404
        assert exc.code == "model_not_found"
        assert exc.param == "model"
    else:
        raise AssertionError("an unknown model must be a 404")


def test_streaming_speech_deltas_reach_the_client(speech_worker: Worker) -> None:
    """Both model families."""
    client = _client(speech_worker)
    stream = client.chat.completions.create(
        model=_model(client),
        messages=HELLO,  # type: ignore[arg-type]
        max_tokens=8,
        stream=True,
        modalities=["text", "audio"],
        audio={"voice": "Ethan", "format": "wav"},  # type: ignore[typeddict-item]
        extra_body={"stage_params": SHORT_SPEECH},
    )
    audio_chunks = [
        chunk.choices[0].delta.audio for chunk in stream if chunk.choices and chunk.choices[0].delta.audio
    ]
    assert audio_chunks
    assert len({audio.id for audio in audio_chunks}) == 1
    for audio in audio_chunks:
        assert audio.data is not None
        assert sf.info(io.BytesIO(base64.b64decode(audio.data))).samplerate == 24000


def test_qwen3_speech_is_code2wav_audio_streamed_or_whole(qwen3_worker: Worker) -> None:
    """Qwen3-Omni through the official client: the same greedy reply, non-streaming and SSE, carries
    the same amount of Code2Wav audio, whole frames of 1920 samples less the 555 the last frame
    lacks (its transposed convolutions' tail needs a frame that never comes)."""
    client = _client(qwen3_worker)
    speech = {
        "model": _model(client),
        "messages": HELLO,
        "max_tokens": 8,
        "temperature": 0,
        "modalities": ["text", "audio"],
        "audio": {"voice": "Aiden", "format": "wav"},
        "extra_body": {"stage_params": {"talker": {"max_tokens": 30, "temperature": 0.0}}},
    }
    whole = client.chat.completions.create(**speech)  # type: ignore[call-overload]
    audio = whole.choices[0].message.audio
    frames = sf.info(io.BytesIO(base64.b64decode(audio.data))).frames
    assert frames > 0 and (frames + 555) % 1920 == 0
    stream = client.chat.completions.create(**speech, stream=True)  # type: ignore[call-overload]
    chunks = [c.choices[0].delta.audio for c in stream if c.choices and c.choices[0].delta.audio]
    assert len(chunks) >= 2  # the first window leaves before the talker ends
    streamed = [sf.info(io.BytesIO(base64.b64decode(c.data))).frames for c in chunks]
    assert streamed[0] == CODEC_WINDOWS["first_chunk"] * 1920
    assert sum(streamed) == frames


def test_audio_in_video_through_mm_processor_kwargs(speech_worker: Worker) -> None:
    """vLLM's ``mm_processor_kwargs: {use_audio_in_video: true}`` (both families): the video's own
    audio track goes in with its frames, so the prompt grows by the soundtrack's tokens; a video
    without a track is a 400 naming the video and the fix, not a 5xx."""
    client = _client(speech_worker)
    video = {
        "type": "video_url",
        "video_url": {"url": data_uri("video/mp4", mp4_bytes(frames=8, fps=4, tone_hz=440))},
    }
    messages = [{"role": "user", "content": [video, {"type": "text", "text": "What do you hear?"}]}]

    def ask(**extra_body: object):
        return client.chat.completions.create(
            model=_model(client),
            messages=messages,
            max_tokens=4,
            extra_body=extra_body,  # type: ignore[arg-type]
        )

    plain = ask()
    with_audio = ask(mm_processor_kwargs={"use_audio_in_video": True})
    assert plain.usage is not None and with_audio.usage is not None
    assert with_audio.usage.prompt_tokens > plain.usage.prompt_tokens + 10  # 2 s of audio tokens
    assert with_audio.choices[0].message.content is not None

    silent = {"type": "video_url", "video_url": {"url": data_uri("video/mp4", mp4_bytes(frames=8, fps=4))}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=_model(client),
            messages=[{"role": "user", "content": [silent]}],  # type: ignore[list-item]
            max_tokens=4,
            extra_body={"mm_processor_kwargs": {"use_audio_in_video": True}},
        )
    error = err.value.body if isinstance(err.value.body, dict) else {}
    assert error.get("param") == "messages[0].content[0].video_url.url", err.value.body
    message = str(error.get("message"))
    assert "no audio track" in message and "use_audio_in_video false" in message
