"""Engine test helpers: real engines on the tiny checkpoint (CPU), each on its own loop thread.

An engine's schedulers live on the loop that started it, so each engine gets one background loop
for the whole module and tests drive it with ``harness.run(coro)``. Speech requests cap the
random talker with ``stage_params.talker.max_tokens`` so audio stays quick on a CPU.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from omni_runtime.contract.engine import (
    ChatTurn,
    EngineEvent,
    Finished,
    GenerationRequest,
    MediaInput,
    SamplingParams,
    TextDelta,
)
from omni_runtime.contract.options import EngineOptions

T = TypeVar("T")
START_TIMEOUT_S = 600.0
_ids = itertools.count()


class Harness:
    """An engine plus the event loop thread it runs on."""

    def __init__(self, options: EngineOptions) -> None:
        from omni_runtime.pipeline import build_engine

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="engine-loop", daemon=True)
        self.thread.start()
        self.engine: Any = build_engine(options)
        self.run(self.engine.start(), timeout=START_TIMEOUT_S)

    def run(self, coro: Awaitable[T], timeout: float = 300.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def collect(self, request: GenerationRequest) -> list[EngineEvent]:
        async def go() -> list[EngineEvent]:
            return [event async for event in self.engine.generate(request)]

        return self.run(go())

    def forget_encodings(self) -> None:
        """Empty the engine's encoder cache, so the next request's media reaches the encoders."""

        async def clear() -> None:
            self.engine.encoders.cache.clear()

        self.run(clear())

    def close(self) -> None:
        self.run(self.engine.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def request(
    text: str = "Hello there",
    *,
    max_tokens: int = 8,
    temperature: float = 0.0,
    seed: int | None = None,
    media: tuple[MediaInput, ...] = (),
    want_audio: bool = False,
    talker_tokens: int = 40,
    ignore_eos: bool = True,
    stop: tuple[str, ...] = (),
) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"t{next(_ids)}",
        turns=(ChatTurn(role="user", text=text, media=media),),
        sampling=SamplingParams(
            max_tokens=max_tokens, temperature=temperature, seed=seed, ignore_eos=ignore_eos, stop=stop
        ),
        want_audio=want_audio,
        stage_params={"talker": {"max_tokens": talker_tokens}},
    )


def token_ids(events: list[EngineEvent]) -> list[int]:
    return [t for e in events if isinstance(e, TextDelta) for t in e.token_ids]


def finished(events: list[EngineEvent]) -> Finished:
    last = events[-1]
    assert isinstance(last, Finished), f"stream did not end with Finished: {last!r}"
    return last


def tone(seconds: float = 1.0, rate: int = 16000) -> MediaInput:
    t = np.arange(int(seconds * rate)) / rate
    return MediaInput(
        kind="audio", data=(0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), sample_rate=rate
    )


def image(height: int = 64, width: int = 80, seed: int = 0) -> MediaInput:
    rng = np.random.default_rng(seed)
    return MediaInput(kind="image", data=rng.integers(0, 255, (height, width, 3), dtype=np.uint8))


def video(frames: int = 4, size: int = 56, seed: int = 0) -> MediaInput:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 255, (frames, size, size, 3), dtype=np.uint8)
    return MediaInput(kind="video", data=data, fps=2.0)


def video_with_soundtrack(
    seconds: float = 2.0, fps: float = 2.0, size: int = 56, seed: int = 0
) -> MediaInput:
    """A video whose audio track goes in with it (use_audio_in_video): frames and a 16 kHz tone."""
    frames = video(frames=int(seconds * fps), size=size, seed=seed)
    return MediaInput(kind="video", data=frames.data, fps=fps, soundtrack=tone(seconds).data)


def interleaved(adapter: Any, ids: list[int]) -> bool:
    """A video's soundtrack tokens sit between its frames' tokens (the processor's interleave)."""
    audio = [i for i, t in enumerate(ids) if t == adapter.audio_token]
    frames = [i for i, t in enumerate(ids) if t == adapter.video_token]
    return bool(frames) and any(frames[0] < a < frames[-1] for a in audio)


def tiny_options(checkpoint: Path, **overrides: Any) -> EngineOptions:
    base: dict[str, Any] = {
        "model_path": str(checkpoint),
        "device": "cpu",
        "pipeline": "streaming-speech",
        "max_batch_size": 8,
        "max_model_len": 1024,
        "session_kv_mb": 64,  # conversation KV on, with a small budget
    }
    return EngineOptions(**{**base, **overrides})
