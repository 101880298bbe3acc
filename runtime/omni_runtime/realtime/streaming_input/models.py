"""Request bodies of streaming-input sessions: session parameters and chunks (pydantic, no torch).

The same parameters open a Mode B session (``POST /v1/streaming_input/sessions``) and head a Mode A
NDJSON body; they mirror the chat-completions fields that apply to one streamed user turn.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from omni_runtime.contract.params import MAX_TOP_K
from omni_runtime.realtime.request_types import Flag, Int, Number, Text

Modality = Literal["text", "audio", "image", "video"]
State = Literal["collecting", "generating", "done", "failed", "cancelled"]


class Chunk(BaseModel):
    """One piece of the input. Its place is ``sequence_id`` (0, 1, 2, ...) or ``offset`` (the byte
    position of its decoded payload in the whole input); a session uses one of the two. Without
    ``modality`` it is inferred (`infer_modality`). A chunk with ``end_of_input`` and no body is an
    end marker: it ends the input like ``POST .../finish``, and may be repeated."""

    model_config = ConfigDict(extra="forbid")

    sequence_id: Int | None = Field(default=None, ge=0, le=1_000_000_000)
    offset: Int | None = Field(default=None, ge=0, le=1 << 40)
    modality: Modality | None = None
    payload: Text | None = None  # base64 (text: UTF-8 bytes)
    text: Text | None = None  # text chunks may send plain text instead of a payload
    end_of_input: Flag = False

    @model_validator(mode="after")
    def _one_body(self) -> Chunk:
        if self.payload is not None and self.text is not None:
            raise ValueError("a chunk carries either text or a base64 payload, not both")
        if self.sequence_id is not None and self.offset is not None:
            raise ValueError("a chunk is placed by sequence_id or by offset, not both")
        if self.sequence_id is None and self.offset is None and not self.end_marker:
            raise ValueError(
                "a chunk needs sequence_id (its number: 0, 1, 2, ...) or offset (the byte position of its payload)"
            )
        return self

    @property
    def end_marker(self) -> bool:
        return self.end_of_input and self.payload is None and self.text is None

    @property
    def place(self) -> str:
        """How error messages name this chunk: ``chunks[3]`` or ``chunks[@1024]``."""
        return f"chunks[{self.sequence_id}]" if self.sequence_id is not None else f"chunks[@{self.offset}]"


_IMAGE_SIGNATURES = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM")


def infer_modality(chunk: Chunk, raw: bytes) -> Modality:
    """A chunk's modality when it names none: text if it sends ``text``; an image if the payload
    starts like an image file (JPEG, PNG, GIF, BMP, WebP); otherwise PCM16 audio. Video frames
    must say ``"modality": "video"`` (unnamed, each is a separate image)."""
    if chunk.modality is not None:
        return chunk.modality
    if chunk.text is not None:
        return "text"
    if raw.startswith(_IMAGE_SIGNATURES) or (raw[:4] == b"RIFF" and raw[8:12] == b"WEBP"):
        return "image"
    return "audio"


class Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: Text


class AudioOutput(BaseModel):
    """Chat-API style ``audio`` object: the voice and the format of streamed audio."""

    model_config = ConfigDict(extra="forbid")

    voice: Text | None = None
    format: Literal["wav", "pcm16"] = "wav"


class StreamingInputParams(BaseModel):
    """Body of session creation (Mode B) or the first NDJSON frame (Mode A)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    model: Text | None = None
    stream: Flag = False
    modalities: list[Literal["text", "audio"]] = ["text"]
    max_tokens: Int | None = Field(
        default=None, ge=1, validation_alias=AliasChoices("max_tokens", "max_completion_tokens")
    )
    temperature: Number = Field(default=1.0, ge=0.0, le=2.0)
    top_p: Number = Field(default=1.0, gt=0.0, le=1.0)
    top_k: Int = Field(default=-1, le=MAX_TOP_K)
    min_p: Number = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: Number = Field(default=1.0, gt=0.0, le=2.0)  # as chat's and the video socket's
    seed: Int | None = None
    stop: Text | list[Text] | None = None
    instructions: Text | None = None
    messages: list[Message] | None = None  # earlier turns (text) before the streamed one
    start_policy: Literal["on_end_only", "on_first_chunk", "on_min_length"] | None = None
    min_length: Int | None = Field(default=None, ge=1)  # bytes of in-order payload for on_min_length
    audio_format: Literal["pcm16"] = "pcm16"
    audio_sample_rate: Literal[8000, 16000, 22050, 24000, 44100, 48000] = 16000
    video_fps: Number = Field(default=2.0, gt=0, le=60)
    voice: Text | None = None
    audio: AudioOutput | None = None
    first_chunk: Chunk | None = Field(default=None, validation_alias=AliasChoices("first_chunk", "chunk"))

    @property
    def requested_voice(self) -> str | None:
        return self.voice or (self.audio.voice if self.audio is not None else None)
