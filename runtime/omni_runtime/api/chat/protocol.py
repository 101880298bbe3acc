"""OpenAI chat-completions request and response models, with the omni extensions.

The request model owns its conversion: `check` refuses what this worker cannot serve,
`media_refs` lists the media to load (with the field path each came from), and
`to_generation_request` builds the engine's `GenerationRequest`. No torch here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from omni_runtime.api.errors import ApiError
from omni_runtime.api.settings import ServingLimits
from omni_runtime.contract.engine import ChatTurn, GenerationRequest, MediaInput, MediaKind, SamplingParams
from omni_runtime.contract.params import MAX_TOP_K
from omni_runtime.contract.stages import STAGES
from omni_runtime.media.video import VideoOptions
from omni_runtime.realtime.request_types import Flag, Int, Number, Text


class _Model(BaseModel):
    # Unknown fields are ignored (OpenAI clients send many); known-but-unsupported ones are refused.
    model_config = ConfigDict(extra="ignore")


class MediaURL(_Model):
    url: Text
    detail: Text | None = None  # OpenAI's image detail hint; the processor decides resolution


def _url_object(value: Any) -> Any:
    return {"url": value} if isinstance(value, str) else value  # accept "image_url": "https://..."


class TextPart(_Model):
    type: Literal["text"]
    text: Text


class ImagePart(_Model):
    type: Literal["image_url"]
    image_url: MediaURL

    @field_validator("image_url", mode="before")
    @classmethod
    def _accept_plain_url(cls, value: Any) -> Any:
        return _url_object(value)


class InputAudio(_Model):
    data: Text = Field(description="base64-encoded audio file (wav, mp3, flac, ogg, m4a)")
    format: Text | None = None  # a hint only: the container is sniffed from the bytes


class InputAudioPart(_Model):
    type: Literal["input_audio"]
    input_audio: InputAudio


class AudioURLPart(_Model):
    type: Literal["audio_url"]  # vLLM's extension: audio by URL / data: URI / path
    audio_url: MediaURL

    @field_validator("audio_url", mode="before")
    @classmethod
    def _accept_plain_url(cls, value: Any) -> Any:
        return _url_object(value)


class VideoPart(_Model):
    type: Literal["video_url"]
    video_url: MediaURL

    @field_validator("video_url", mode="before")
    @classmethod
    def _accept_plain_url(cls, value: Any) -> Any:
        return _url_object(value)


def _part_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return f"type={kind}" if isinstance(kind, str) else None


ContentPart = Annotated[
    Annotated[TextPart, Tag("type=text")]
    | Annotated[ImagePart, Tag("type=image_url")]
    | Annotated[InputAudioPart, Tag("type=input_audio")]
    | Annotated[AudioURLPart, Tag("type=audio_url")]
    | Annotated[VideoPart, Tag("type=video_url")],
    Discriminator(_part_tag),
]


class ChatMessage(_Model):
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[ContentPart] | None = None
    name: Text | None = None


class AudioOutput(_Model):
    format: Literal["wav", "pcm16"] = "wav"
    voice: Text | None = None  # a speaker of the checkpoint; None: the talker's default


class ResponseFormat(_Model):
    """OpenAI's ``response_format``: only plain text is served (no constrained JSON decoding)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class StreamOptions(_Model):
    include_usage: Flag | None = None


class MMProcessorKwargs(_Model):
    """vLLM's ``mm_processor_kwargs``: of the processor's options, the one that changes a prompt."""

    # Qwen-Omni: a video's audio track goes in with it, its tokens interleaved with the frames'.
    use_audio_in_video: Flag = False


@dataclass(frozen=True)
class MediaRef:
    """One media item named by the request: what it is, where it is, which field named it."""

    kind: MediaKind
    source: str
    param: str
    turn: int  # index into messages
    inline_base64: bool = False


class ChatCompletionRequest(_Model):
    model: Text | None = None  # optional: a worker serves one model
    messages: list[ChatMessage]
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioOutput | None = None
    images: list[Text] | None = None
    audios: list[Text] | None = None
    videos: list[Text] | None = None
    video_fps: Number | None = Field(default=None, gt=0, le=60)
    video_max_frames: Int | None = Field(default=None, ge=1)
    video_min_pixels: Int | None = Field(default=None, ge=1)
    video_max_pixels: Int | None = Field(default=None, ge=1)
    video_total_pixels: Int | None = Field(default=None, ge=1)
    max_tokens: Int | None = Field(default=None, ge=1)
    max_completion_tokens: Int | None = Field(default=None, ge=1)
    temperature: Number = Field(default=1.0, ge=0.0, le=2.0)
    top_p: Number = Field(default=1.0, gt=0.0, le=1.0)
    top_k: Int = Field(default=-1, ge=-1, le=MAX_TOP_K)
    min_p: Number = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: Number = Field(default=1.0, gt=0.0, le=2.0)
    stop: Text | list[Text] | None = None
    seed: Int | None = None
    stream: Flag = False
    stream_options: StreamOptions | None = None
    stage_params: dict[str, dict[str, Any]] | None = None
    mm_processor_kwargs: MMProcessorKwargs | None = None  # vLLM's extension (use_audio_in_video)
    # vLLM's extension, used by `omni bench`: generate exactly max_tokens, ignoring end-of-sequence.
    ignore_eos: Flag = False
    # Standard fields with only one supported value: refused with a clear message otherwise.
    n: Int = Field(default=1, ge=1)
    tools: list[dict[str, Any]] | None = None
    logprobs: Flag | None = None
    user: Text | None = None
    response_format: ResponseFormat | None = None

    @field_validator("messages")
    @classmethod
    def _not_empty(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        if not messages:
            raise ValueError("messages must contain at least one message")
        return messages

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if (isinstance(stop, list) and any(not s for s in stop)) or stop == "":
            raise ValueError("stop strings must not be empty")
        return stop

    @model_validator(mode="after")
    def _pixel_budgets_ordered(self) -> ChatCompletionRequest:
        if self.video_min_pixels and self.video_max_pixels and self.video_min_pixels > self.video_max_pixels:
            raise ValueError("video_min_pixels must not exceed video_max_pixels")
        return self

    # --- what this worker can serve ----------------------------------------------------------

    @property
    def use_audio_in_video(self) -> bool:
        return bool(self.mm_processor_kwargs and self.mm_processor_kwargs.use_audio_in_video)

    @property
    def wants_audio(self) -> bool:
        return bool(self.modalities and "audio" in self.modalities)

    @property
    def requested_max_tokens(self) -> tuple[int | None, str]:
        """The caller's token budget and the field that set it (max_completion_tokens wins)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    def check(self, limits: ServingLimits) -> None:
        """Refuse (ApiError) what is valid JSON but not servable here; cheap, before media loading."""
        if self.model is not None and self.model != limits.model_name:
            raise ApiError(
                f"The model `{self.model}` does not exist on this worker; it serves `{limits.model_name}`.",
                status=404,
                param="model",
                code="model_not_found",
            )
        if self.n != 1:
            raise ApiError("Only n=1 is supported.", param="n", code="unsupported_value")
        if self.tools:
            raise ApiError(
                "Tool calling is not supported by this worker.", param="tools", code="unsupported_value"
            )
        if self.response_format is not None and self.response_format.type != "text":
            raise ApiError(
                f"response_format {self.response_format.type!r} is not supported: this worker cannot "
                'constrain its output to JSON; leave response_format out or send {"type": "text"}.',
                param="response_format",
                code="unsupported_value",
            )
        if self.logprobs:
            raise ApiError(
                "logprobs are not supported by this worker.", param="logprobs", code="unsupported_value"
            )
        self._check_prompt_size(limits)
        requested, field = self.requested_max_tokens
        if requested is not None and requested > limits.max_tokens_limit:
            raise ApiError(
                f"{field} is {requested}, above this worker's limit of {limits.max_tokens_limit}; ask for fewer tokens.",
                param=field,
                code="max_tokens_too_large",
            )
        if self.wants_audio and not limits.supports_audio_output:
            raise ApiError(
                'This worker serves text only (started with --text-only or --pipeline text); remove "audio" '
                "from modalities, or send the request to a speech worker.",
                param="modalities",
                code="audio_output_unavailable",
            )
        if self.video_max_frames is not None and self.video_max_frames > limits.max_video_frames:
            raise ApiError(
                f"video_max_frames is {self.video_max_frames}, above this worker's limit of {limits.max_video_frames}.",
                param="video_max_frames",
                code="invalid_value",
            )
        for stage, params in (self.stage_params or {}).items():
            if stage not in STAGES:
                raise ApiError(
                    f"stage_params names an unknown stage {stage!r}; stages are {', '.join(sorted(STAGES))}.",
                    param=f"stage_params.{stage}",
                    code="invalid_value",
                )
            if not isinstance(params.get("ignore_eos", False), bool):
                raise ApiError(
                    f"stage_params.{stage}.ignore_eos must be true or false, not {params['ignore_eos']!r}.",
                    param=f"stage_params.{stage}.ignore_eos",
                    code="invalid_value",
                )
        if not any(m.role == "user" for m in self.messages) and (self.images or self.audios or self.videos):
            raise ApiError(
                "images, audios and videos are added to the first user message, but there is none.",
                param="messages",
                code="invalid_value",
            )

    def _check_prompt_size(self, limits: ServingLimits) -> None:
        """Refuse prompts that cannot fit the context before any tokenizer sees them."""
        if limits.max_prompt_messages is not None and len(self.messages) > limits.max_prompt_messages:
            raise ApiError(
                f"messages holds {len(self.messages)} messages; this worker takes at most "
                f"{limits.max_prompt_messages} (its context is too short for more).",
                param="messages",
                code="too_many_messages",
            )
        if limits.max_prompt_chars is None:
            return
        total = 0
        for i, message in enumerate(self.messages):
            if isinstance(message.content, str):
                total += len(message.content)
            elif message.content is not None:
                total += sum(len(part.text) for part in message.content if isinstance(part, TextPart))
            if total > limits.max_prompt_chars:
                raise ApiError(
                    f"The messages up to messages[{i}] hold more than {limits.max_prompt_chars} characters of "
                    "text, more than this worker's context can take; send less text.",
                    param=f"messages[{i}].content",
                    code="prompt_too_long",
                )

    def video_options(self) -> VideoOptions:
        return VideoOptions(
            fps=self.video_fps,
            max_frames=self.video_max_frames,
            min_pixels=self.video_min_pixels,
            max_pixels=self.video_max_pixels,
            total_pixels=self.video_total_pixels,
        )

    def media_refs(self) -> list[MediaRef]:
        """Every media item in request order; top-level lists join the first user message."""
        refs: list[MediaRef] = []
        for i, message in enumerate(self.messages):
            if not isinstance(message.content, list):
                continue
            for j, part in enumerate(message.content):
                base = f"messages[{i}].content[{j}]"
                if isinstance(part, ImagePart):
                    refs.append(MediaRef("image", part.image_url.url, f"{base}.image_url.url", i))
                elif isinstance(part, InputAudioPart):
                    refs.append(MediaRef("audio", part.input_audio.data, f"{base}.input_audio.data", i, True))
                elif isinstance(part, AudioURLPart):
                    refs.append(MediaRef("audio", part.audio_url.url, f"{base}.audio_url.url", i))
                elif isinstance(part, VideoPart):
                    refs.append(MediaRef("video", part.video_url.url, f"{base}.video_url.url", i))
        first_user = next((i for i, m in enumerate(self.messages) if m.role == "user"), 0)
        for field, kind in (("images", "image"), ("audios", "audio"), ("videos", "video")):
            for k, source in enumerate(getattr(self, field) or []):
                refs.append(MediaRef(kind, source, f"{field}[{k}]", first_user))  # type: ignore[arg-type]
        return refs

    def to_generation_request(
        self, *, request_id: str, media: dict[str, MediaInput], limits: ServingLimits
    ) -> GenerationRequest:
        """The engine request; ``media`` maps each MediaRef.param to its decoded input."""
        by_turn: dict[int, list[MediaInput]] = {}
        for ref in self.media_refs():
            by_turn.setdefault(ref.turn, []).append(media[ref.param])
        turns = []
        for i, message in enumerate(self.messages):
            if isinstance(message.content, list):
                text = "\n".join(p.text for p in message.content if isinstance(p, TextPart))
            else:
                text = message.content or ""
            role = "system" if message.role == "developer" else message.role
            turns.append(ChatTurn(role=role, text=text, media=tuple(by_turn.get(i, ()))))
        requested, _ = self.requested_max_tokens
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        sampling = SamplingParams(
            max_tokens=requested
            if requested is not None
            else min(limits.default_max_tokens, limits.max_tokens_limit),
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            stop=stop,
            seed=self.seed,
            ignore_eos=self.ignore_eos
            or bool((self.stage_params or {}).get("thinker", {}).get("ignore_eos")),
        )
        return GenerationRequest(
            request_id=request_id,
            turns=tuple(turns),
            sampling=sampling,
            want_audio=self.wants_audio,
            voice=self.audio.voice if self.audio else None,
            stream_audio=self.stream,
            stage_params={k: dict(v) for k, v in (self.stage_params or {}).items()},
        )


# --- responses ------------------------------------------------------------------------------


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    audio_seconds: float | None = None  # omni extension: seconds of speech generated
    # OpenAI's field: prompt tokens served from the session's kept KV (X-Session-Id).
    prompt_tokens_details: dict[str, int] | None = None


class AudioReply(BaseModel):
    id: str
    data: str  # base64 WAV (header states sample_rate) or raw PCM16 LE
    expires_at: int
    transcript: str
    format: Literal["wav", "pcm16"] = "wav"
    sample_rate: int  # omni extension: the talker's true rate, needed to play pcm16


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    audio: AudioReply | None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[Choice]
    usage: UsageInfo
    system_fingerprint: str | None = None


class StreamChoice(BaseModel):
    index: int = 0
    delta: dict[str, Any]
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[StreamChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None
