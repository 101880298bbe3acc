"""API settings: what `omni serve` flags decide about the HTTP surface (limits, names, model card)."""

from __future__ import annotations

from dataclasses import dataclass, field

from omni_runtime.media.limits import MediaLimits


@dataclass(frozen=True)
class ApiSettings:
    served_model_name: str | None = None  # None: the engine's model_name
    max_tokens_limit: int | None = None  # None: the engine's max_model_len
    default_max_tokens: int = 2048  # when a request sets neither max_tokens nor max_completion_tokens
    media: MediaLimits = field(default_factory=MediaLimits)
    # The model card says so plainly when the weights are random (tiny checkpoint, --load-format dummy).
    # None: use the engine's own `random_weights` attribute when it has one.
    random_weights: bool | None = None
    model_path: str | None = None
    worker_id: str = "worker-0"
    revision: str = "dev"
    warmup: bool = True  # run one short generation before /ready turns 200
    # Freeze what startup left alive out of the garbage collector's full passes once ready
    # (omni_runtime.support.gc_pauses). `omni serve` turns it on; apps built in tests leave it off.
    gc_freeze: bool = False
    audio_expiry_s: int = 3600  # `expires_at` of audio replies (we keep nothing; clients expect the field)
    # Checked before tokenizing; None: derived from the model's context (realtime.settings.prompt_limits).
    max_prompt_chars: int | None = None
    max_prompt_messages: int | None = None


@dataclass(frozen=True)
class ServingLimits:
    """What this worker serves, for `ChatCompletionRequest.check` (filled from settings + engine)."""

    model_name: str
    max_tokens_limit: int
    default_max_tokens: int
    supports_audio_output: bool
    max_video_frames: int
    max_prompt_chars: int | None = None  # None: no cap
    max_prompt_messages: int | None = None
