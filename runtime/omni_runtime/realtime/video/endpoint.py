"""The /v1/video/chat/stream WebSocket: frames and audio stream in, queries are answered from them.

Client events: ``session.config``, ``video.frame`` {data}, ``audio.chunk`` {data}, ``video.query``
{text}, ``video.done``. Server events: ``response.start``, ``response.text.delta``/``.done``,
``response.audio.delta``/``.done``, ``response.done``, ``session.done``, ``error``. Queries are
answered one after another in arrival order by one worker task (back-to-back queries never race),
each from the frames buffered when it is asked, and the session keeps the earlier questions and
answers as conversation history. Every fault a client can cause is an ``error`` event; the socket
stays open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import numpy as np
from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect

from omni_runtime.contract.engine import (
    AudioChunk,
    ChatTurn,
    Engine,
    EngineError,
    Finished,
    GenerationRequest,
    SamplingParams,
    TextDelta,
)
from omni_runtime.media.errors import MediaError
from omni_runtime.media.resample import resample
from omni_runtime.realtime.audio import MODEL_RATE, decode_b64, float_to_b64_pcm16, pcm16_to_float
from omni_runtime.realtime.errors import (
    INVALID_EVENT,
    INVALID_JSON,
    INVALID_MEDIA,
    SESSION_LIMIT,
    UNKNOWN_EVENT,
    ProtocolError,
    invalid,
    missing,
)
from omni_runtime.realtime.metrics import RealtimeMetrics
from omni_runtime.realtime.outbox import Outbox
from omni_runtime.realtime.protocol import close_quietly, engine_voice, new_id
from omni_runtime.realtime.settings import RealtimeSettings, default_max_tokens
from omni_runtime.realtime.video.state import VideoBuffer, VideoConfig

log = logging.getLogger("omni.realtime")
_SAMPLING_KEYS = {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed"}


class VideoSession:
    def __init__(self, *, engine: Engine, settings: RealtimeSettings, metrics: RealtimeMetrics) -> None:
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.outbox = Outbox(beta=False, keep_log=False, max_log_events=0, max_log_bytes=0)
        self.config = VideoConfig.model_validate({})
        self.buffer = VideoBuffer(
            limits=settings.media_limits,
            max_bytes=settings.max_video_buffer_bytes,
            max_audio_seconds=settings.max_video_audio_seconds,
        )
        self.history: list[ChatTurn] = []
        self._queries: asyncio.Queue[str | None] = asyncio.Queue()
        self.worker = asyncio.create_task(self._answer_queries())
        self.done = False

    def error(self, exc: ProtocolError) -> None:
        self.metrics.errors.labels(kind="video", code=exc.code).inc()
        self.outbox.emit("error", error=exc.error_body(), message=exc.message)

    async def handle_text(self, text: str) -> None:
        try:
            if len(text) > self.settings.max_event_bytes:
                raise ProtocolError(
                    f"the message is {len(text)} bytes; at most {self.settings.max_event_bytes} are accepted",
                    code="event_too_large",
                )
            try:
                event = json.loads(text)
            except ValueError as exc:
                raise ProtocolError(f"the message is not valid JSON: {exc}", code=INVALID_JSON) from exc
            if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                raise ProtocolError(
                    'an event is a JSON object with a string "type"', code=INVALID_EVENT, param="type"
                )
            await self._dispatch(event)
        except ProtocolError as exc:
            self.error(exc)

    async def _dispatch(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if self.done:
            raise ProtocolError(
                "the session is done (video.done was sent); open a new session", code="session_finished"
            )
        if kind == "session.config":
            self._configure(event)
        elif kind == "video.frame":
            await self._frame(event)
        elif kind == "audio.chunk":
            self._audio(event)
        elif kind == "video.query":
            query = event.get("text", event.get("query"))
            if not isinstance(query, str) or not query.strip():
                raise missing("text", where="video.query")
            self._queries.put_nowait(query)
        elif kind == "video.done":
            self.done = True
            self._queries.put_nowait(None)
        else:
            raise ProtocolError(
                f"unknown event type {kind!r}; supported: session.config, video.frame, audio.chunk, video.query, video.done",
                code=UNKNOWN_EVENT,
                param="type",
            )

    def _configure(self, event: dict[str, Any]) -> None:
        body = event.get("config", event.get("session", {k: v for k, v in event.items() if k != "type"}))
        try:
            config = VideoConfig.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(part) for part in first["loc"]) or "config"
            raise invalid(field, first["msg"]) from exc
        if config.max_frames > self.settings.max_video_frames:
            raise invalid("max_frames", f"this worker allows at most {self.settings.max_video_frames}")
        if config.modalities and "audio" in config.modalities and not self.engine.supports_audio_output:
            raise invalid("modalities", "this worker serves text only; use ['text']")
        engine_voice(config.voice, engine=self.engine, param="voice")
        self.config = config
        evicted = self.buffer.trim_frames(config.max_frames)
        if evicted:
            self.metrics.video_frames.labels(outcome="evicted").inc(evicted)

    async def _frame(self, event: dict[str, Any]) -> None:
        if "data" not in event:
            raise missing("data", where="video.frame")
        data = decode_b64(
            _strip_data_uri(event["data"]), param="data", max_bytes=self.settings.max_video_frame_bytes
        )
        try:
            result = await asyncio.to_thread(self.buffer.add_frame, data, config=self.config)
        except MediaError as exc:
            raise ProtocolError(f"data: {exc.message}", code=INVALID_MEDIA, param="data") from exc
        self.metrics.video_frames.labels(outcome=result.outcome).inc()
        if result.evicted:
            self.metrics.video_frames.labels(outcome="evicted").inc(result.evicted)

    def _audio(self, event: dict[str, Any]) -> None:
        if "data" not in event:
            raise missing("data", where="audio.chunk")
        pcm = pcm16_to_float(
            decode_b64(event["data"], param="data", max_bytes=self.settings.max_event_bytes), param="data"
        )
        rate = event.get("sample_rate", MODEL_RATE)
        if rate not in (16_000, 24_000, 48_000):
            raise invalid("sample_rate", "expected 16000 (or 24000 / 48000)")
        self.buffer.add_audio(resample(pcm, orig_sr=rate, target_sr=MODEL_RATE))

    def _want_audio(self) -> bool:
        modalities = self.config.modalities
        if modalities is None:
            return self.engine.supports_audio_output
        return "audio" in modalities

    def _sampling(self) -> SamplingParams:
        params = (self.config.sampling_params_list or [{}])[0]
        known = {key: params[key] for key in _SAMPLING_KEYS if key in params}
        max_tokens = params.get(
            "max_new_tokens",
            params.get(
                "max_tokens", default_max_tokens(self.settings, max_model_len=self.engine.max_model_len)
            ),
        )
        try:
            return SamplingParams(max_tokens=int(max_tokens), **known)
        except TypeError as exc:
            raise invalid("sampling_params_list", str(exc)) from exc

    async def _answer_queries(self) -> None:
        while (query := await self._queries.get()) is not None:
            try:
                await self._answer(query)
            except ProtocolError as exc:
                self.error(exc)
        self.outbox.emit("session.done", stats=self.buffer.stats())
        self.outbox.close()

    async def _answer(self, query: str) -> None:
        response_id = new_id("resp")
        turns: list[ChatTurn] = []
        if self.config.system_prompt:
            turns.append(ChatTurn(role="system", text=self.config.system_prompt))
        turns.extend(self.history)
        turns.append(self.buffer.query_turn(query, config=self.config))
        want_audio = self._want_audio()
        request = GenerationRequest(
            request_id=response_id,
            turns=tuple(turns),
            sampling=self._sampling(),
            want_audio=want_audio,
            voice=engine_voice(self.config.voice, engine=self.engine, param="voice"),
        )
        self.outbox.emit("response.start", response_id=response_id, stats=self.buffer.stats())
        text, status, usage = "", "failed", None
        stream = self.engine.generate(request)
        try:
            async for item in stream:
                if isinstance(item, TextDelta) and item.text:
                    text += item.text
                    self.outbox.emit("response.text.delta", response_id=response_id, delta=item.text)
                elif isinstance(item, AudioChunk) and item.pcm.size:
                    self.outbox.emit(
                        "response.audio.delta",
                        response_id=response_id,
                        data=float_to_b64_pcm16(np.asarray(item.pcm)),
                        format="pcm16",
                        sample_rate=item.sample_rate,
                    )
                elif isinstance(item, Finished):
                    status = "completed" if item.reason in ("stop", "length") else item.reason
                    usage = {
                        "prompt_tokens": item.usage.prompt_tokens,
                        "completion_tokens": item.usage.completion_tokens,
                    }
        except EngineError as exc:
            self.error(ProtocolError(str(exc), code="engine_error", param=exc.param))
        finally:
            await close_quietly(stream)
        self.outbox.emit("response.text.done", response_id=response_id, text=text)
        if want_audio:
            self.outbox.emit("response.audio.done", response_id=response_id)
        self.outbox.emit("response.done", response_id=response_id, status=status, usage=usage)
        self.history.append(ChatTurn(role="user", text=query))
        self.history.append(ChatTurn(role="assistant", text=text))

    async def close(self) -> None:
        self.worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.worker


def _strip_data_uri(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("data:"):
        return value.partition(",")[2]
    return value


async def serve_video(
    ws: WebSocket,
    *,
    engine: Engine,
    settings: RealtimeSettings,
    metrics: RealtimeMetrics,
    live: set[VideoSession],
) -> None:
    await ws.accept()
    if len(live) >= settings.max_video_sessions:
        metrics.sessions_refused.labels(kind="video").inc()
        error = ProtocolError(
            f"this worker already serves {settings.max_video_sessions} video sessions; retry later",
            code=SESSION_LIMIT,
        )
        await ws.send_text(
            json.dumps({"type": "error", "error": error.error_body(), "message": error.message})
        )
        await ws.close(code=1013)
        return
    session = VideoSession(engine=engine, settings=settings, metrics=metrics)
    live.add(session)
    metrics.sessions.labels(kind="video").set(len(live))
    metrics.sessions_started.labels(kind="video").inc()
    sender = asyncio.create_task(_send(ws, session))
    try:
        while not session.done:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                break
            if message.get("text") is None:
                session.error(
                    ProtocolError(
                        "binary frames are not part of the protocol; send JSON events", code=INVALID_EVENT
                    )
                )
                continue
            await session.handle_text(message["text"])
        if session.done:
            await sender  # the worker answers the queued queries, then sends session.done
    except WebSocketDisconnect:
        pass
    finally:
        await session.close()
        sender.cancel()
        live.discard(session)
        metrics.sessions.labels(kind="video").set(len(live))
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await ws.close()


async def _send(ws: WebSocket, session: VideoSession) -> None:
    try:
        while (text := await session.outbox.next_text()) is not None:
            await ws.send_text(text)
    except (WebSocketDisconnect, RuntimeError):
        return
