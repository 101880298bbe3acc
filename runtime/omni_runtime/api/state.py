"""Per-app state: the engine, settings, metrics and the readiness flags, on ``app.state.omni``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from omni_runtime.api.metrics import ApiMetrics
from omni_runtime.api.settings import ApiSettings, ServingLimits
from omni_runtime.contract.engine import Engine
from omni_runtime.realtime.capacity import SpeechCapacity
from omni_runtime.realtime.settings import prompt_limits


@dataclass
class AppState:
    engine: Engine
    settings: ApiSettings
    metrics: ApiMetrics = field(init=False)
    warmed_up: bool = False
    startup_error: str | None = None
    in_flight: int = 0
    on_startup_failure: Callable[[BaseException], None] | None = None
    realtime: Any = None  # the RealtimeServer serving this worker's session endpoints

    def __post_init__(self) -> None:
        self.metrics = ApiMetrics(stats=self.engine.stats, in_flight=lambda: self.in_flight)

    @property
    def model_name(self) -> str:
        return self.settings.served_model_name or self.engine.model_name

    @property
    def ready(self) -> bool:
        return self.warmed_up and self.startup_error is None and self.engine.ready

    @property
    def speech(self) -> SpeechCapacity | None:
        """The worker's speech stream slots (shared with the session endpoints), once built."""
        return self.realtime.speech if self.realtime is not None else None

    @property
    def random_weights(self) -> bool:
        if self.settings.random_weights is not None:
            return self.settings.random_weights
        return bool(getattr(self.engine, "random_weights", False))

    def serving_limits(self) -> ServingLimits:
        max_chars, max_messages = prompt_limits(
            self.engine.max_model_len,
            max_chars=self.settings.max_prompt_chars,
            max_messages=self.settings.max_prompt_messages,
        )
        return ServingLimits(
            model_name=self.model_name,
            max_tokens_limit=self.settings.max_tokens_limit or self.engine.max_model_len,
            default_max_tokens=self.settings.default_max_tokens,
            supports_audio_output=self.engine.supports_audio_output,
            max_video_frames=self.settings.media.max_video_frames,
            max_prompt_chars=max_chars,
            max_prompt_messages=max_messages,
        )


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.omni
    return state
