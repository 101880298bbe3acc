"""Connection-level helpers of the chat serving: SSE responses that always clean up, watching for a
client that leaves, closing engine streams under cancellation, and joining audio chunks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
import numpy as np
from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from omni_runtime.api.errors import ApiError
from omni_runtime.contract.engine import AudioChunk, EngineEvent
from omni_runtime.media.resample import resample

T = TypeVar("T")


class EventStreamResponse(StreamingResponse):
    """SSE response that always runs ``on_close`` (even if the body never started), so the engine
    stream never outlives the client."""

    media_type = "text/event-stream"

    def __init__(
        self, content: AsyncIterator[str], *, on_close: Callable[[], Awaitable[None]], **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                aclose = getattr(self.body_iterator, "aclose", None)
                if aclose is not None:
                    await aclose()
                await self.on_close()


async def close_stream(events: AsyncIterator[EngineEvent]) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        with anyio.CancelScope(shield=True):
            await aclose()


async def _wait_for_disconnect(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(raw: Request, work: Awaitable[T]) -> tuple[bool, T | None]:
    """Run ``work`` while watching the client; (True, None) when it left first (``work`` is cancelled)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(raw))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task.done():
        return False, task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return True, None


def error_event(error: ApiError) -> str:
    return f"data: {json.dumps({'error': error.detail.model_dump()})}\n\n"


def join_audio(chunks: list[AudioChunk], *, fallback_rate: int) -> tuple[np.ndarray, int]:
    """All chunks as one waveform at the first chunk's true rate (others resampled if they differ)."""
    if not chunks:
        return np.zeros(0, dtype=np.float32), fallback_rate
    rate = chunks[0].sample_rate
    pieces = [
        c.pcm if c.sample_rate == rate else resample(c.pcm, orig_sr=c.sample_rate, target_sr=rate)
        for c in chunks
    ]
    return np.concatenate([np.asarray(p, dtype=np.float32).reshape(-1) for p in pieces]), rate
