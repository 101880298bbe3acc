"""The answer of a streaming-input session: the engine's events as chat-completion SSE and result.

Runs once the input is complete (`StreamingInputSession._begin`): each text or audio event is
published as a ``chat.completion.chunk`` (replayable from the first), and the end becomes the
session's ``chat.completion`` result, or its failure as OpenAI error JSON.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from omni_runtime.contract.engine import (
    AudioChunk,
    Engine,
    EngineError,
    Finished,
    GenerationRequest,
    TextDelta,
    Usage,
)
from omni_runtime.realtime.errors import ProtocolError
from omni_runtime.realtime.protocol import close_quietly
from omni_runtime.realtime.streaming_input import chat_format
from omni_runtime.realtime.streaming_input.models import State, StreamingInputParams


class AnsweringSession(Protocol):
    """What the answer needs of its session (`session.StreamingInputSession`)."""

    params: StreamingInputParams
    engine: Engine
    completion: str
    created: int
    want_audio: bool
    state: State

    @property
    def audio_format(self) -> str: ...

    result: dict[str, Any] | None

    def touch(self) -> None: ...

    async def publish(self, event: dict[str, Any] | str) -> None: ...

    def fail(self, error: ProtocolError) -> None: ...


async def generate(session: AnsweringSession, request: GenerationRequest) -> None:
    """Run the request; its events become SSE chunks, its end the session's result (or failure)."""
    model = session.params.model or session.engine.model_name

    def chunk(delta: dict[str, Any], reason: str | None = None, usage: Usage | None = None) -> dict[str, Any]:
        return chat_format.chunk_json(
            completion=session.completion,
            model=model,
            created=session.created,
            delta=delta,
            reason=reason,
            usage=usage,
        )

    text, audio, rate, reason, usage = "", [], session.engine.output_sample_rate, "stop", Usage()
    await session.publish(chunk({"role": "assistant", "content": ""}))
    stream = session.engine.generate(request)
    try:
        async for event in stream:
            session.touch()
            if isinstance(event, TextDelta) and event.text:
                text += event.text
                await session.publish(chunk({"content": event.text}))
            elif isinstance(event, AudioChunk) and event.pcm.size:
                audio.append(np.asarray(event.pcm, dtype=np.float32))
                rate = event.sample_rate
                delta = chat_format.audio_delta(
                    event.pcm, sample_rate=rate, completion=session.completion, fmt=session.audio_format
                )
                await session.publish(chunk(delta))
            elif isinstance(event, Finished):
                reason, usage = event.reason, event.usage
    except EngineError as exc:
        session.fail(ProtocolError(str(exc), code="engine_error", param=exc.param, status=exc.status))
        return
    finally:
        await close_quietly(stream)
    if reason == "error":
        session.fail(
            ProtocolError(
                "the engine failed on this request; see the worker log",
                code="engine_error",
                status=500,
                type="server_error",
            )
        )
        return
    pcm = np.concatenate(audio) if audio else None
    session.result = chat_format.completion_json(
        completion=session.completion,
        model=model,
        created=session.created,
        text=text,
        audio=pcm if session.want_audio else None,
        sample_rate=rate,
        reason=reason,
        usage=usage,
    )
    await session.publish(chunk({}, reason=reason, usage=usage))
    session.state = "done"
    await session.publish("[DONE]")
