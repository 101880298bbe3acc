"""Request bodies of streaming-input sessions: session parameters and chunks (pydantic, no torch).

The same parameters open a Mode B session (``POST /v1/streaming_input/sessions``) and head a Mode A
NDJSON body; they mirror the chat-completions fields that apply to one streamed user turn.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

Modality = Literal["text", "audio", "image", "video"]


class Chunk(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sequence_id: int = Field(ge=0, le=1_000_000_000)
    modality: Modality
    payload: str | None = None  # base64 (text: UTF-8 bytes)
    text: str | None = None  # text chunks may send plain text instead of a payload
    end_of_input: bool = False


class Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class StreamingInputParams(BaseModel):
    """Body of session creation (Mode B) or the first NDJSON frame (Mode A)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    model: str | None = None
    stream: bool = False
    modalities: list[Literal["text", "audio"]] = ["text"]
    max_tokens: int | None = Field(
        default=None, ge=1, validation_alias=AliasChoices("max_tokens", "max_completion_tokens")
    )
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = -1
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    instructions: str | None = None
    messages: list[Message] | None = None  # earlier turns (text) before the streamed one
    start_policy: Literal["on_end_only", "on_first_chunk", "on_min_length"] | None = None
    min_length: int | None = Field(default=None, ge=1)  # bytes of in-order payload for on_min_length
    audio_format: Literal["pcm16"] = "pcm16"
    audio_sample_rate: Literal[8000, 16000, 22050, 24000, 44100, 48000] = 16000
    video_fps: float = Field(default=2.0, gt=0, le=60)
    voice: str | None = None
    audio: dict[str, Any] | None = None  # chat-API style {"voice": ..., "format": ...}
    first_chunk: Chunk | None = Field(default=None, validation_alias=AliasChoices("first_chunk", "chunk"))
