"""HTTP for streaming-input sessions: Mode B (a session resource) and Mode A (NDJSON chat body).

Mode B: ``POST /v1/streaming_input/sessions`` → ``{session_id, expires_in}``; ``POST .../{id}/chunks``;
``POST .../{id}/finish`` (idempotent); ``GET .../{id}/result`` (chat completion) or
``GET .../{id}/stream`` (SSE); ``GET .../{id}`` (status); ``DELETE .../{id}``. Session ids name
this worker, so the router sends every follow-up here. Idle sessions are released after
``session_timeout_s``. Mode A: ``POST /v1/chat/completions`` with ``X-Streaming-Input: true`` and a
chunked NDJSON body: an optional first line of request parameters, then chunk lines
``{"modality", "payload", "end_of_input"}`` (sequence ids optional: line order is the order).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from omni_runtime.contract.engine import Engine
from omni_runtime.contract.sessions import make_session_id
from omni_runtime.realtime.errors import (
    DISABLED,
    INPUT_NOT_FINISHED,
    INVALID_JSON,
    PAYLOAD_TOO_LARGE,
    SESSION_LIMIT,
    SESSION_NOT_FOUND,
    ProtocolError,
    invalid,
)
from omni_runtime.realtime.metrics import RealtimeMetrics
from omni_runtime.realtime.settings import RealtimeSettings
from omni_runtime.realtime.streaming_input.models import Chunk, StreamingInputParams
from omni_runtime.realtime.streaming_input.session import StreamingInputSession

_BODY_OVERHEAD = 64 * 1024  # JSON around a payload whose base64 is 4/3 of its bytes


class StreamingInputManager:
    def __init__(self, *, engine: Engine, settings: RealtimeSettings, metrics: RealtimeMetrics) -> None:
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.sessions: dict[str, StreamingInputSession] = {}
        self._reaper: asyncio.Task[None] | None = None

    def _gauge(self) -> None:
        self.metrics.sessions.labels(kind="streaming_input").set(len(self.sessions))

    def create(self, params: StreamingInputParams) -> StreamingInputSession:
        if not self.settings.streaming_input_enabled:
            raise ProtocolError("streaming input is disabled on this worker", code=DISABLED, status=404)
        if len(self.sessions) >= self.settings.max_streaming_input_sessions:
            self.metrics.sessions_refused.labels(kind="streaming_input").inc()
            raise ProtocolError(
                f"this worker already holds {self.settings.max_streaming_input_sessions} streaming-input sessions; "
                "retry later",
                code=SESSION_LIMIT,
                status=429,
            )
        session = StreamingInputSession(
            session_id=make_session_id(worker_id=self.settings.worker_id, prefix="si"),
            params=params,
            engine=self.engine,
            settings=self.settings,
        )
        self.sessions[session.id] = session
        self.metrics.sessions_started.labels(kind="streaming_input").inc()
        self._gauge()
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap())
        return session

    def get(self, session_id: str) -> StreamingInputSession:
        session = self.sessions.get(session_id)
        if session is None:
            raise ProtocolError(
                f"no streaming-input session {session_id!r} on this worker (it expired after "
                f"{self.settings.session_timeout_s:g} s idle, was deleted, or never existed)",
                code=SESSION_NOT_FOUND,
                param="session_id",
                status=404,
            )
        session.touch()
        return session

    async def remove(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        self._gauge()
        if session is not None:
            await session.cancel()

    async def _reap(self) -> None:
        timeout = self.settings.session_timeout_s
        while self.sessions:
            await asyncio.sleep(min(1.0, max(timeout / 4, 0.01)))
            now = time.monotonic()
            for session_id, session in list(self.sessions.items()):
                if now - session.last_activity > timeout:
                    await self.remove(session_id)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for session_id in list(self.sessions):
            await self.remove(session_id)


def error_response(exc: ProtocolError) -> JSONResponse:
    return JSONResponse(exc.http_json(), status_code=exc.status)


def _validation(exc: ValidationError, *, prefix: str = "") -> ProtocolError:
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    return invalid(f"{prefix}{field}" if field else prefix.rstrip(".") or "body", first["msg"])


async def read_body(request: Request, *, limit: int) -> bytes:
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise ProtocolError(
                f"the request body passes {limit} bytes, more than one session may carry",
                code=PAYLOAD_TOO_LARGE,
                status=413,
            )
    return bytes(body)


def _parse(model: type[BaseModel], raw: bytes, *, prefix: str = "") -> Any:
    try:
        data = json.loads(raw or b"{}")
    except ValueError as exc:
        raise ProtocolError(f"the body is not valid JSON: {exc}", code=INVALID_JSON) from exc
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _validation(exc, prefix=prefix) from exc


def streaming_input_router(*, manager: StreamingInputManager, metrics: RealtimeMetrics) -> APIRouter:
    router = APIRouter(tags=["streaming input"])
    limit = manager.settings.max_payload_per_session * 4 // 3 + _BODY_OVERHEAD
    base = "/v1/streaming_input/sessions"

    async def guarded(work: Any) -> Response:
        try:
            return await work()
        except ProtocolError as exc:
            metrics.errors.labels(kind="streaming_input", code=exc.code).inc()
            return error_response(exc)

    @router.post(base)
    async def create(request: Request) -> Response:
        async def work() -> Response:
            params = _parse(StreamingInputParams, await read_body(request, limit=limit))
            session = manager.create(params)
            body = {**session.status(), "expires_in": int(manager.settings.session_timeout_s)}
            if params.first_chunk is not None:
                body["chunk"] = await session.add_chunk(params.first_chunk)
                metrics.streaming_input_bytes.inc(session.received_bytes)
            return JSONResponse(body)

        return await guarded(work)

    @router.post(base + "/{session_id}/chunks")
    async def add_chunk(session_id: str, request: Request) -> Response:
        async def work() -> Response:
            session = manager.get(session_id)
            chunk = _parse(Chunk, await read_body(request, limit=limit))
            before = session.received_bytes
            ack = await session.add_chunk(chunk)
            metrics.streaming_input_bytes.inc(session.received_bytes - before)
            return JSONResponse(ack, status_code=202 if ack["accepted"] else 200)

        return await guarded(work)

    @router.post(base + "/{session_id}/finish")
    async def finish(session_id: str) -> Response:
        async def work() -> Response:
            return JSONResponse(await manager.get(session_id).finish())

        return await guarded(work)

    @router.get(base + "/{session_id}")
    async def status(session_id: str) -> Response:
        async def work() -> Response:
            return JSONResponse(manager.get(session_id).status())

        return await guarded(work)

    @router.delete(base + "/{session_id}")
    async def delete(session_id: str) -> Response:
        async def work() -> Response:
            manager.get(session_id)
            await manager.remove(session_id)
            return JSONResponse({"id": session_id, "object": "streaming_input.session", "deleted": True})

        return await guarded(work)

    @router.get(base + "/{session_id}/result")
    async def result(session_id: str, wait: float | None = None) -> Response:
        async def work() -> Response:
            session = manager.get(session_id)
            return await result_response(
                session, wait=manager.settings.result_wait_s if wait is None else wait
            )

        return await guarded(work)

    @router.get(base + "/{session_id}/stream")
    async def stream(session_id: str) -> Response:
        async def work() -> Response:
            return sse_response(manager.get(session_id))

        return await guarded(work)

    return router


async def result_response(session: StreamingInputSession, *, wait: float) -> Response:
    if session.state == "collecting":
        raise ProtocolError(
            "the input is not finished: send a chunk with end_of_input, or POST .../finish",
            code=INPUT_NOT_FINISHED,
            status=409,
        )
    with contextlib.suppress(TimeoutError):
        await session.wait_result(timeout=max(wait, 0.0))
    if session.failure is not None:
        raise session.failure
    if session.result is None:
        return JSONResponse(session.status(), status_code=202)
    return JSONResponse(session.result)


def sse_response(session: StreamingInputSession) -> StreamingResponse:
    async def events() -> AsyncIterator[str]:
        async for payload in session.stream_events():
            yield payload

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def streaming_input_chat_completion(request: Request, *, manager: StreamingInputManager) -> Response:
    """Mode A: one ``/v1/chat/completions`` request whose chunked body is NDJSON input frames."""
    session: StreamingInputSession | None = None
    try:
        session, params = await _feed_ndjson(request, manager=manager)
        await session.finish()
        if params.stream:
            return sse_response(session)
        return await result_response(session, wait=float("inf"))
    except ProtocolError as exc:
        manager.metrics.errors.labels(kind="streaming_input", code=exc.code).inc()
        return error_response(exc)
    finally:
        if session is not None and not (session.params.stream and session.state in ("generating", "done")):
            await manager.remove(session.id)
        elif session is not None:
            # A streamed answer outlives this function; the idle reaper releases the session after it.
            session.touch()


async def _feed_ndjson(
    request: Request, *, manager: StreamingInputManager
) -> tuple[StreamingInputSession, StreamingInputParams]:
    session: StreamingInputSession | None = None
    params = StreamingInputParams.model_validate({})
    pending = b""
    line_no = 0
    chunks = 0
    total = 0
    limit = manager.settings.max_payload_per_session * 4 // 3 + _BODY_OVERHEAD

    async def handle(line: bytes) -> None:
        nonlocal session, params, chunks
        try:
            frame = json.loads(line)
        except ValueError as exc:
            raise ProtocolError(f"line {line_no} is not valid JSON: {exc}", code=INVALID_JSON) from exc
        if not isinstance(frame, dict):
            raise invalid(f"line {line_no}", "each line is a JSON object")
        if "modality" not in frame:
            if session is not None:
                raise invalid(f"line {line_no}", "request parameters must come before the first chunk")
            try:
                params = StreamingInputParams.model_validate(frame)
            except ValidationError as exc:
                raise _validation(exc) from exc
            session = manager.create(params)
            return
        if session is None:
            session = manager.create(params)
        frame.setdefault("sequence_id", chunks)
        chunks += 1
        try:
            chunk = Chunk.model_validate(frame)
        except ValidationError as exc:
            raise _validation(exc, prefix=f"line {line_no}.") from exc
        await session.add_chunk(chunk)

    try:
        async for piece in request.stream():
            total += len(piece)
            if total > limit:
                raise ProtocolError(
                    f"the request body passes {limit} bytes, more than one session may carry",
                    code=PAYLOAD_TOO_LARGE,
                    status=413,
                )
            pending += piece
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    line_no += 1
                    await handle(line)
        if pending.strip():
            line_no += 1
            await handle(pending)
    except ProtocolError:
        if session is not None:
            await manager.remove(session.id)
        raise
    if session is None:
        raise invalid("body", "the NDJSON body holds no input frames")
    return session, params
