"""Answering one ``video.query``: the engine request and the response events, failures included.

A query is frozen when it is asked (`Query`: the frames sampled and the audio taken then, and its
checked sampling), so the worker that answers queries one after another never races the socket
reader and never meets an unchecked value. Once ``response.start`` is sent the response always
ends with ``response.text.done``, ``response.audio.done`` (when audio was asked for) and
``response.done``, whatever happens in between: an engine fault is an ``error`` event and a
``failed`` status, never a silent stop.

Audio goes out as vLLM-Omni 0.30 sends it: each delta one complete base64 WAV file (RIFF header
stating the rate, 16-bit mono PCM) with ``format: "wav"``, under the released name
``response.output_audio.delta`` and again under the legacy ``response.audio.delta`` that older
clients know (a client listens to one of the two).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from omni_runtime.contract.engine import (
    AudioChunk,
    ChatTurn,
    Engine,
    EngineError,
    Finished,
    GenerationRequest,
    TextDelta,
)
from omni_runtime.media.audio import encode_wav
from omni_runtime.realtime.errors import ENGINE_ERROR, SERVER_ERROR, ProtocolError
from omni_runtime.realtime.outbox import Outbox
from omni_runtime.realtime.protocol import close_quietly, new_id
from omni_runtime.realtime.video.sampling import VideoSampling

log = logging.getLogger("omni.realtime")

AUDIO_DELTA_NAMES = ("response.output_audio.delta", "response.audio.delta")  # released, legacy
AUDIO_DONE_NAMES = ("response.output_audio.done", "response.audio.done")


@dataclass(frozen=True)
class Query:
    text: str
    turn: ChatTurn
    sampling: VideoSampling
    want_audio: bool
    voice: str | None
    stats: dict[str, Any]


def wav_b64(pcm: np.ndarray, *, sample_rate: int) -> str:
    """One audio delta: a complete WAV file (header included), base64."""
    return base64.b64encode(encode_wav(pcm, sample_rate=sample_rate)).decode("ascii")


@dataclass
class _Reply:
    response_id: str
    text: str = ""
    status: str = "failed"
    usage: dict[str, int] | None = None


def _request(
    query: Query,
    *,
    response_id: str,
    system_prompt: str | None,
    history: list[ChatTurn],
    session_key: str | None,
) -> GenerationRequest:
    turns: list[ChatTurn] = [ChatTurn(role="system", text=system_prompt)] if system_prompt else []
    turns.extend(history)
    turns.append(query.turn)
    return GenerationRequest(
        request_id=response_id,
        turns=tuple(turns),
        sampling=query.sampling.sampling,
        want_audio=query.want_audio,
        voice=query.voice,
        stage_params={stage: dict(params) for stage, params in query.sampling.stage_params.items()},
        session_key=session_key,
    )


async def _stream(
    engine: Engine,
    request: GenerationRequest,
    *,
    outbox: Outbox,
    reply: _Reply,
    report: Callable[[ProtocolError], None],
) -> None:
    stream = engine.generate(request)
    try:
        async for item in stream:
            if isinstance(item, TextDelta) and item.text:
                reply.text += item.text
                outbox.emit("response.text.delta", response_id=reply.response_id, delta=item.text)
            elif isinstance(item, AudioChunk) and item.pcm.size:
                data = wav_b64(np.asarray(item.pcm), sample_rate=item.sample_rate)
                for name in AUDIO_DELTA_NAMES:
                    outbox.emit(
                        name,
                        response_id=reply.response_id,
                        data=data,
                        format="wav",
                        sample_rate=item.sample_rate,
                    )
            elif isinstance(item, Finished):
                stopped = {"stop": "completed", "length": "completed", "error": "failed"}
                reply.status = stopped.get(item.reason, item.reason)
                reply.usage = {
                    "prompt_tokens": item.usage.prompt_tokens,
                    "completion_tokens": item.usage.completion_tokens,
                    "total_tokens": item.usage.prompt_tokens + item.usage.completion_tokens,
                }
                if item.reason == "error":  # a worker fault: its details go to the log, not the client
                    log.error("video query %s failed in the engine: %s", reply.response_id, item.error)
                    report(
                        ProtocolError(
                            "the engine failed this query; the details are in the worker log; the session "
                            "goes on, send another video.query",
                            code=ENGINE_ERROR,
                            type=SERVER_ERROR,
                        )
                    )
    finally:
        await close_quietly(stream)


async def answer(
    query: Query,
    *,
    engine: Engine,
    outbox: Outbox,
    history: list[ChatTurn],
    system_prompt: str | None,
    report: Callable[[ProtocolError], None],
    session_key: str | None = None,
) -> None:
    """Run one query and stream its response; ``history`` gains the question and the answer.

    When the prompt no longer fits the model's context (the engine refuses ``messages`` before
    any output), the oldest question and answer leave the history and the query is asked again,
    so a long session keeps working on its recent turns instead of failing every query.
    """
    reply = _Reply(response_id=new_id("resp"))
    outbox.emit("response.start", response_id=reply.response_id, stats=query.stats)
    try:
        while True:
            request = _request(
                query,
                response_id=reply.response_id,
                system_prompt=system_prompt,
                history=history,
                session_key=session_key,
            )
            try:
                await _stream(engine, request, outbox=outbox, reply=reply, report=report)
                break
            except EngineError as exc:
                if exc.param != "messages" or reply.text or len(history) < 2:
                    raise
                del history[:2]
                log.info(
                    "video query %s: prompt too long, the oldest turn leaves the history", reply.response_id
                )
    except EngineError as exc:
        report(ProtocolError(str(exc), code=ENGINE_ERROR, param=exc.param))
    except Exception as exc:  # any fault ends this response with an error event; the session goes on
        log.exception("video query %s failed", reply.response_id)
        report(
            ProtocolError(
                f"the query failed inside the worker ({type(exc).__name__}); the session goes on, "
                "send another video.query",
                code=SERVER_ERROR,
                type=SERVER_ERROR,
            )
        )
        reply.status = "failed"
    finally:
        outbox.emit("response.text.done", response_id=reply.response_id, text=reply.text)
        if query.want_audio:
            for name in AUDIO_DONE_NAMES:
                outbox.emit(name, response_id=reply.response_id)
        outbox.emit("response.done", response_id=reply.response_id, status=reply.status, usage=reply.usage)
    if reply.status == "completed":  # a failed answer is not history the next query should build on
        history.append(ChatTurn(role="user", text=query.text))
        history.append(ChatTurn(role="assistant", text=reply.text))
