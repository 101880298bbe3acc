"""HTTP of streaming-input sessions: Mode B (a session resource) and Mode A (NDJSON chat body).

Mode B: ``POST /v1/streaming_input/sessions`` → ``{session_id, expires_in}``; a chunk by
``POST .../{id}/chunks``, ``POST .../{id}/append`` or ``PATCH .../{id}`` (one handler; a 413 closes
the session);
``POST .../{id}/finish`` (idempotent); ``GET .../{id}/result`` (chat completion) or
``GET .../{id}/stream`` (SSE); ``GET .../{id}`` (status); ``DELETE .../{id}``. Session ids name
this worker, so the router sends every follow-up here. Idle sessions are released after
``session_timeout_s``. Mode A: ``POST /v1/chat/completions`` with ``X-Streaming-Input: true`` (or
``Content-Type: application/x-multipart-streaming``) and a chunked NDJSON body: an optional first line of request parameters, then chunk lines
``{"modality", "payload", "end_of_input"}`` (sequence ids optional: line order is the order). The
chat route (`omni_runtime.api.chat.routes`) sees the header and calls `chat_completion`.

The sessions themselves (`omni_runtime.realtime.streaming_input`) raise `ProtocolError`; every
error answer here goes through `omni_runtime.api.errors` as OpenAI error JSON.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from omni_runtime.api.errors import error_responses, from_protocol_error
from omni_runtime.api.streaming_input.parsing import body_limit, feed_ndjson, parse_body, read_body
from omni_runtime.realtime.errors import INPUT_NOT_FINISHED, ProtocolError
from omni_runtime.realtime.streaming_input.manager import StreamingInputManager
from omni_runtime.realtime.streaming_input.models import Chunk, StreamingInputParams
from omni_runtime.realtime.streaming_input.session import StreamingInputSession

STREAMING_INPUT_HEADER = "x-streaming-input"
STREAMING_INPUT_TYPE = "application/x-multipart-streaming"


def is_streaming_input(request: Request) -> bool:
    """Mode A: ``X-Streaming-Input: true``, or the streaming content type."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return (
        request.headers.get(STREAMING_INPUT_HEADER, "").lower() == "true"
        or media_type == STREAMING_INPUT_TYPE
    )


def install_streaming_input(app: FastAPI, manager: StreamingInputManager) -> None:
    """Serve Mode B on ``app``, and Mode A to the chat route (which finds ``manager`` on the app)."""
    app.state.streaming_input = manager
    app.include_router(streaming_input_router(manager))


def error_response(exc: ProtocolError, *, manager: StreamingInputManager) -> Response:
    manager.metrics.errors.labels(kind="streaming_input", code=exc.code).inc()
    return from_protocol_error(exc).response()


def streaming_input_router(manager: StreamingInputManager) -> APIRouter:
    router = APIRouter(tags=["streaming input"])
    metrics = manager.metrics
    limit = body_limit(manager.settings)
    base = "/v1/streaming_input/sessions"

    async def guarded(work: Callable[[], Awaitable[Response]]) -> Response:
        try:
            return await work()
        except ProtocolError as exc:
            return error_response(exc, manager=manager)

    @router.post(base, responses=error_responses(400, 404, 413, 429))
    async def create(request: Request) -> Response:
        async def work() -> Response:
            params = parse_body(StreamingInputParams, await read_body(request, limit=limit))
            session = manager.create(params)
            body = {**session.status(), "expires_in": int(manager.settings.session_timeout_s)}
            if params.first_chunk is not None:
                body["chunk"] = await session.add_chunk(params.first_chunk)
                metrics.streaming_input_bytes.inc(session.received_bytes)
            return JSONResponse(body)

        return await guarded(work)

    chunk_responses: dict[int | str, dict[str, Any]] = {
        **error_responses(400, 404, 409, 413),
        200: {"description": "A duplicate, acknowledged and ignored; or an end marker's session status"},
    }

    async def add_chunk(session_id: str, request: Request) -> Response:
        async def work() -> Response:
            session = manager.get(session_id)
            try:
                chunk = parse_body(Chunk, await read_body(request, limit=limit))
                before = session.received_bytes
                ack = await session.add_chunk(chunk)
            except ProtocolError as exc:
                if exc.status == 413:  # past what one session may carry: the session ends here
                    await manager.remove(session_id)
                raise
            metrics.streaming_input_bytes.inc(session.received_bytes - before)
            status = 202 if ack["accepted"] and not chunk.end_marker else 200
            return JSONResponse(ack, status_code=status)

        return await guarded(work)

    # One handler, three spellings: the RFC's chunks resource, an append action, and PATCH.
    for path, method in (("/chunks", "POST"), ("/append", "POST"), ("", "PATCH")):
        router.add_api_route(
            base + "/{session_id}" + path,
            add_chunk,
            methods=[method],
            status_code=202,
            responses=chunk_responses,
            name=f"add_chunk_{method.lower()}{path.replace('/', '_')}",
        )

    @router.post(base + "/{session_id}/finish", responses=error_responses(404))
    async def finish(session_id: str) -> Response:
        async def work() -> Response:
            return JSONResponse(await manager.get(session_id).finish())

        return await guarded(work)

    @router.get(base + "/{session_id}", responses=error_responses(404))
    async def status(session_id: str) -> Response:
        async def work() -> Response:
            return JSONResponse(manager.get(session_id).status())

        return await guarded(work)

    @router.delete(base + "/{session_id}", responses=error_responses(404))
    async def delete(session_id: str) -> Response:
        async def work() -> Response:
            manager.get(session_id)
            await manager.remove(session_id)
            return JSONResponse({"id": session_id, "object": "streaming_input.session", "deleted": True})

        return await guarded(work)

    @router.get(
        base + "/{session_id}/result",
        responses={
            **error_responses(400, 404, 409, 500),
            202: {"description": "Still generating: the session's status"},
        },
    )
    async def result(
        session_id: str,
        wait: float | None = Query(
            default=None,
            ge=0.0,
            le=manager.settings.max_result_wait_s,
            allow_inf_nan=False,
            description="seconds to wait for a running generation",
        ),
    ) -> Response:
        async def work() -> Response:
            session = manager.get(session_id)
            return await result_response(
                session, wait=manager.settings.result_wait_s if wait is None else wait
            )

        return await guarded(work)

    @router.get(
        base + "/{session_id}/stream",
        response_class=StreamingResponse,
        responses={
            **error_responses(404),
            200: {
                "description": "chat.completion.chunk events, then data: [DONE]",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            },
        },
    )
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


async def chat_completion(request: Request) -> Response:
    """Mode A: one ``/v1/chat/completions`` request whose chunked body is NDJSON input frames."""
    manager: StreamingInputManager = request.app.state.streaming_input
    session: StreamingInputSession | None = None
    try:
        session, params = await feed_ndjson(request, manager=manager)
        await session.finish()
        if params.stream:
            return sse_response(session)
        return await result_response(session, wait=float("inf"))
    except ProtocolError as exc:
        return error_response(exc, manager=manager)
    finally:
        if session is not None and not (session.params.stream and session.state in ("generating", "done")):
            await manager.remove(session.id)
        elif session is not None:
            # A streamed answer outlives this function; the idle reaper releases the session after it.
            session.touch()
