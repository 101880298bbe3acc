"""A scripted engine for protocol and state-machine tests: deterministic text and audio, paced.

It implements the `Engine` protocol with no model: each request gets a reply naming how many turns
it saw (so tests can check that history is kept), one word per step, and after each word a chunk
of a 440 Hz tone when audio is wanted. Pacing (``step_s``) makes a response last long enough to be
interrupted. Every request and every cancellation is recorded for the tests to inspect.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from omni_runtime.contract.engine import (
    AudioChunk,
    EngineEvent,
    EngineStats,
    Finished,
    GenerationRequest,
    MediaInput,
    TextDelta,
    Usage,
)


@dataclass
class ScriptedEngine:
    model_name: str = "scripted"
    output_sample_rate: int = 24_000
    supports_audio_output: bool = True
    max_model_len: int = 4096
    voices: tuple[str, ...] = ("Chelsie", "Ethan")
    default_voice: str | None = "Chelsie"
    words: int = 4
    step_s: float = 0.0
    chunk_ms: int = 200
    requests: list[GenerationRequest] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    prefetched: list[tuple[MediaInput, ...]] = field(default_factory=list)
    prefetched_prefixes: list[tuple[MediaInput, ...]] = field(default_factory=list)  # audio_prefix=True
    ended_sessions: list[str] = field(default_factory=list)
    warmed: list[GenerationRequest] = field(default_factory=list)
    fault: str | None = None  # set: every request ends at once as a worker fault with this detail

    @property
    def ready(self) -> bool:
        return True

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def stats(self) -> EngineStats:
        return EngineStats()

    async def refresh_stats(self) -> None:
        return None

    audio_chunk_samples: int | None = None

    def prefetch_media(self, media: Sequence[MediaInput], *, audio_prefix: bool = False) -> bool:
        (self.prefetched_prefixes if audio_prefix else self.prefetched).append(tuple(media))
        return True

    def end_session(self, session_key: str) -> None:
        self.ended_sessions.append(session_key)

    async def warm_session(self, request: GenerationRequest) -> int:
        self.warmed.append(request)
        return 0

    def reply_words(self, request: GenerationRequest) -> list[str]:
        base = [f"turns{len(request.turns)}"] + [f"w{i}" for i in range(1, self.words)]
        return base[: request.sampling.max_tokens]

    def generate(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        self.requests.append(request)
        return self._run(request)

    async def _run(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        words = self.reply_words(request)
        samples = self.output_sample_rate * self.chunk_ms // 1000
        t = np.arange(samples) / self.output_sample_rate
        tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
        if self.fault is not None:
            yield Finished(reason="error", error=self.fault)
            return
        try:
            for index, word in enumerate(words):
                if self.step_s:
                    await asyncio.sleep(self.step_s)
                yield TextDelta(text=word if index == 0 else f" {word}")
                if request.want_audio:
                    yield AudioChunk(pcm=tone, sample_rate=self.output_sample_rate)
            reason = "length" if len(words) < self.words else "stop"
            yield Finished(
                reason=reason,
                usage=Usage(
                    prompt_tokens=10 * len(request.turns),
                    completion_tokens=len(words),
                    audio_seconds=len(words) * self.chunk_ms / 1000 if request.want_audio else 0.0,
                ),
            )
            self.finished.append(request.request_id)
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled.append(request.request_id)
            raise
