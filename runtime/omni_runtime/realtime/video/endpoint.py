"""The /v1/video/chat/stream WebSocket: frames and audio stream in, queries are answered from them.

Client events (vLLM-Omni 0.30's protocol): ``session.config``, ``video.frame`` {data, frame_id?},
``audio.chunk`` {data: PCM16 16 kHz}, ``video.query`` {text, audio_data?}, ``video.done``, ``ping``.
Server events: ``video.frame.ack`` (for a frame with a ``frame_id``), ``response.start``,
``response.text.delta``/``.done``, audio deltas (see `query`), ``response.done``,
``session.done``, ``pong``, ``error`` {message, error}.

Every value a client sends is checked when its event arrives, so a fault is an ``error`` event
naming the field and the session goes on. Queries are frozen when asked (the frames sampled then,
the audio sent since the previous query) and answered one after another in arrival order by one
worker task, so back-to-back queries never race; the session keeps earlier questions and answers
as conversation history. Whatever fails inside a query ends that response with an ``error``
event; the worker always finishes, so ``video.done`` always gets ``session.done`` and the
session's slot is always released. A session silent for ``session_idle_timeout_s`` while no
query is being answered is closed with an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect

from omni_runtime.contract.engine import ChatTurn, Engine
from omni_runtime.media.errors import MediaError
from omni_runtime.media.resample import resample
from omni_runtime.realtime.audio import MODEL_RATE, decode_b64, pcm16_to_float
from omni_runtime.realtime.errors import (
    INVALID_EVENT,
    INVALID_JSON,
    INVALID_MEDIA,
    SERVER_ERROR,
    SESSION_LIMIT,
    UNKNOWN_EVENT,
    ProtocolError,
    invalid,
    missing,
)
from omni_runtime.realtime.metrics import RealtimeMetrics
from omni_runtime.realtime.outbox import Outbox
from omni_runtime.realtime.protocol import engine_voice, new_id
from omni_runtime.realtime.request_types import Text, check_text
from omni_runtime.realtime.settings import RealtimeSettings, default_max_tokens, prompt_limits
from omni_runtime.realtime.video.query import Query, answer
from omni_runtime.realtime.video.sampling import VideoSampling, resolve_sampling, validation_error
from omni_runtime.realtime.video.state import VideoBuffer, VideoConfig

log = logging.getLogger("omni.realtime")
EVENTS = "session.config, video.frame, audio.chunk, video.query, video.done, ping"


class QueryEvent(BaseModel):
    """The fields of ``video.query``; ``sampling_params_list`` / ``stage_params`` override the
    session's for this query only."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    text: Text | None = None
    query: Text | None = None  # an older spelling of text
    audio_data: Text | None = None  # base64 PCM16 16 kHz, appended before the query
    sampling_params_list: Any = None
    stage_params: Any = None


class VideoSession:
    def __init__(self, *, engine: Engine, settings: RealtimeSettings, metrics: RealtimeMetrics) -> None:
        self.engine = engine
        self.kv_key = new_id("video")  # conversation KV: its queries share the history's prefix
        self.settings = settings
        self.metrics = metrics
        self.outbox = Outbox(beta=False, keep_log=False, max_log_events=0, max_log_bytes=0)
        self.config = VideoConfig.model_validate({})
        self.sampling = self._resolve(None, None, where="session.config")
        self.buffer = VideoBuffer(
            limits=settings.media_limits,
            max_bytes=settings.max_video_buffer_bytes,
            max_audio_seconds=settings.max_video_audio_seconds,
        )
        self.history: list[ChatTurn] = []
        self._queries: asyncio.Queue[Query | None] = asyncio.Queue()
        self.answering = False
        self.worker = asyncio.create_task(self._answer_queries())
        self.done = False

    @property
    def busy(self) -> bool:
        """Whether a query is waiting or being answered (the client may be silent meanwhile)."""
        return self.answering or not self._queries.empty()

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
            except (ValueError, RecursionError) as exc:  # RecursionError: nesting too deep to parse
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
            if "data" not in event:
                raise missing("data", where="audio.chunk")
            self._audio(event["data"], param="data", rate=event.get("sample_rate", MODEL_RATE))
        elif kind == "video.query":
            self._queries.put_nowait(self._query(event))
        elif kind == "video.done":
            self.done = True
            self._queries.put_nowait(None)
        elif kind == "ping":
            self.outbox.emit("pong")
        else:
            raise ProtocolError(
                f"unknown event type {kind!r}; supported: {EVENTS}", code=UNKNOWN_EVENT, param="type"
            )

    def _resolve(self, sampling_params_list: Any, stage_params: Any, *, where: str) -> VideoSampling:
        return resolve_sampling(
            sampling_params_list,
            stage_params,
            default_max_tokens=default_max_tokens(self.settings, max_model_len=self.engine.max_model_len),
            max_model_len=self.engine.max_model_len,
            where=where,
        )

    def _configure(self, event: dict[str, Any]) -> None:
        body = event.get("config", event.get("session", {k: v for k, v in event.items() if k != "type"}))
        if not isinstance(body, dict):
            raise invalid("config", "expected an object of session settings")
        try:
            config = VideoConfig.model_validate(body)
        except ValidationError as exc:
            raise validation_error(exc) from exc
        if config.max_frames > self.settings.max_video_frames:
            raise invalid("max_frames", f"this worker allows at most {self.settings.max_video_frames}")
        if config.modalities and "audio" in config.modalities and not self.engine.supports_audio_output:
            raise invalid("modalities", "this worker serves text only; use ['text']")
        if config.system_prompt is not None:
            check_text(config.system_prompt, param="system_prompt", max_chars=self._max_chars)
        engine_voice(config.voice, engine=self.engine, param="voice")
        sampling = self._resolve(config.sampling_params_list, config.stage_params, where="session.config")
        self.config, self.sampling = config, sampling
        evicted = self.buffer.trim_frames(config.max_frames)
        if evicted:
            self.metrics.video_frames.labels(outcome="evicted").inc(evicted)

    @property
    def _max_chars(self) -> int:
        return prompt_limits(self.engine.max_model_len, max_chars=self.settings.max_prompt_chars)[0]

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
        frame_id = event.get("frame_id")
        if isinstance(frame_id, str) and frame_id:  # vLLM-Omni acknowledges frames that carry an id
            ack: dict[str, Any] = {
                "frame_id": frame_id,
                "accepted": result.outcome == "kept",
                "buffered_frames": len(self.buffer.frames),
            }
            ack.update(  # echoed when a finite number: Infinity or NaN back would not be strict JSON
                {
                    k: event[k]
                    for k in ("pts_ms", "capture_ts_ms")
                    if type(event.get(k)) in (int, float) and math.isfinite(event[k])
                }
            )
            if result.outcome == "filtered":
                ack["reason"] = "filtered"
            self.outbox.emit("video.frame.ack", **ack)

    def _audio(self, data: Any, *, param: str, rate: Any) -> None:
        if type(rate) is not int or rate not in (16_000, 24_000, 48_000):
            raise invalid("sample_rate", "expected 16000 (or 24000 / 48000)")
        pcm = pcm16_to_float(
            decode_b64(data, param=param, max_bytes=self.settings.max_event_bytes), param=param
        )
        self.buffer.add_audio(resample(pcm, orig_sr=rate, target_sr=MODEL_RATE), param=param)

    def _want_audio(self) -> bool:
        modalities = self.config.modalities
        if modalities is None:
            return self.engine.supports_audio_output
        return "audio" in modalities

    def _query(self, event: dict[str, Any]) -> Query:
        """Check a video.query and freeze it: sampling, frames and audio as they are now."""
        try:
            fields = QueryEvent.model_validate(event)
        except ValidationError as exc:
            raise validation_error(exc) from exc
        text = fields.text if fields.text is not None else (fields.query or "")
        check_text(text, param="text", max_chars=self._max_chars)
        sampling = self.sampling
        if fields.sampling_params_list is not None or fields.stage_params is not None:
            sampling = self._resolve(fields.sampling_params_list, fields.stage_params, where="video.query")
        if fields.audio_data is not None:
            self._audio(fields.audio_data, param="audio_data", rate=MODEL_RATE)
        if not text.strip() and not self.buffer.audio.size and not self.buffer.frames:
            # vLLM-Omni answers a query without text about the buffered frames and audio
            raise missing("text", where="video.query (or send frames or audio before it)")
        stats = self.buffer.stats()
        return Query(
            text=text,
            turn=self.buffer.query_turn(text, config=self.config),
            sampling=sampling,
            want_audio=self._want_audio(),
            voice=engine_voice(self.config.voice, engine=self.engine, param="voice"),
            stats=stats,
        )

    async def _answer_queries(self) -> None:
        try:
            while (query := await self._queries.get()) is not None:
                self.answering = True
                try:
                    await answer(
                        query,
                        engine=self.engine,
                        outbox=self.outbox,
                        history=self.history,
                        system_prompt=self.config.system_prompt,
                        report=self.error,
                        session_key=self.kv_key,
                    )
                except Exception:  # `answer` reports its own faults: this is the last line
                    log.exception("video query failed")
                    self.error(ProtocolError("the query failed inside the worker", code=SERVER_ERROR))
                finally:
                    self.answering = False
            self.outbox.emit("session.done", stats=self.buffer.stats())
        finally:
            self.outbox.close()  # the sender always ends, so the socket (and its slot) is released

    async def close(self) -> None:
        self.worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.worker
        self.engine.end_session(self.kv_key)


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
            try:
                message = await asyncio.wait_for(ws.receive(), timeout=settings.session_idle_timeout_s)
            except TimeoutError:
                if session.busy:
                    continue  # the client is waiting for an answer, not idle
                session.error(
                    ProtocolError(
                        f"no event for {settings.session_idle_timeout_s:g} s; the session is closed",
                        code="session_idle_timeout",
                    )
                )
                await session.close()  # closes the outbox: the sender sends the error and ends
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(sender, timeout=5)
                break
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
