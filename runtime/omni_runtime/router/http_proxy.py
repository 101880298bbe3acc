"""HTTP requests through the router: bind, forward, stream back unbuffered.

Written against raw ASGI rather than framework request/response objects: the proxy path is the hot
path and only needs headers, a body and a byte stream. Small complete answers (JSON with a
Content-Length) are read whole and sent in one message; everything else (SSE, chunked, large) is
relayed chunk by chunk as the worker produces it, with a watcher that closes the upstream stream
as soon as the client goes away, so a worker stops generating for nobody.

A request that fails to reach its worker before any response byte (connect refused, reset) is
retried once on the next candidate, unless it belongs to a pinned session or its streamed body was
already partly sent. A worker's 429 at its speech stream limit (`binding.capacity_refused`) moves
an unpinned request with a whole body to the next untried candidate the same way. A worker that fails mid-stream ends an SSE stream with an error event and
any other stream by closing the connection, so a client never waits on a dead worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl, quote

from omni_runtime.router import logs
from omni_runtime.router.binding import Binding, BindKind, capacity_refused, retry_candidate
from omni_runtime.router.context import HOP_BY_HOP, RouterContext
from omni_runtime.router.errors import RouterError
from omni_runtime.router.upstream_client import UpstreamError, UpstreamResponse, UpstreamTimeout

log = logging.getLogger("omni.router")

Scope = dict[str, Any]
Receive = Any
Send = Any

WHOLE_BODY_LIMIT = 1024 * 1024  # answers up to this size (with Content-Length) are sent in one piece


class ClientGone(Exception):
    """The client disconnected while sending its request body."""


class BodyTooLarge(Exception):
    pass


async def send_error(send: Send, error: RouterError) -> None:
    await send({"type": "http.response.start", "status": error.status, "headers": error.headers()})
    await send({"type": "http.response.body", "body": error.body(), "more_body": False})


def request_query(scope: Scope) -> dict[str, str]:
    raw: bytes = scope.get("query_string", b"")
    if b"session_id" not in raw:  # the only parameter binding reads; skip parsing otherwise
        return {}
    return dict(parse_qsl(raw.decode("latin-1")))


def header_map(scope: Scope, *names: bytes) -> dict[str, str]:
    """The named request headers (lower-case names) as str, for binding."""
    found: dict[str, str] = {}
    for name, value in scope["headers"]:
        if name in names:
            found[name.decode("latin-1")] = value.decode("latin-1")
    return found


def _add_forwarded(scope: Scope, headers: list[tuple[bytes, bytes]]) -> None:
    client = scope.get("client")
    if client:
        headers.append((b"x-forwarded-for", client[0].encode()))
    headers.append((b"x-forwarded-proto", b"https" if scope.get("scheme") in {"https", "wss"} else b"http"))


_NOT_FORWARDED = HOP_BY_HOP | {b"content-length"}


def scan_request_headers(
    scope: Scope, session_header: bytes
) -> tuple[int | None, dict[str, str], list[tuple[bytes, bytes]]]:
    """One pass over the request headers: the content length (None when absent or not a number),
    the session-key header for binding, and the headers to forward to the worker."""
    content_length: int | None = None
    binding: dict[str, str] = {}
    forward: list[tuple[bytes, bytes]] = []
    for name, value in scope["headers"]:
        if name in _NOT_FORWARDED:
            if name == b"content-length":
                content_length = int(value) if value.isdigit() else None
            continue
        if name == session_header:
            binding[name.decode("latin-1")] = value.decode("latin-1")
        forward.append((name, value))
    _add_forwarded(scope, forward)
    return content_length, binding, forward


def request_target(scope: Scope) -> str:
    """The path and query as the client sent them (still percent-encoded)."""
    raw_path: bytes | None = scope.get("raw_path")
    path = raw_path.decode("latin-1") if raw_path else quote(scope["path"])
    query: bytes = scope.get("query_string", b"")
    return f"{path}?{query.decode('latin-1')}" if query else path


async def _read_body(
    receive: Receive, first: dict[str, Any], *, content_length: int | None, limit: int
) -> bytes | AsyncIterator[bytes]:
    """The whole body when it is small or sized; a lazy stream for chunked uploads (NDJSON input)."""
    if first["type"] == "http.disconnect":
        raise ClientGone
    body: bytes = first.get("body", b"")
    if len(body) > limit:
        raise BodyTooLarge
    if not first.get("more_body", False):
        return body
    if content_length is not None:
        parts = [body]
        size = len(body)
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)

    async def stream() -> AsyncIterator[bytes]:
        size = len(body)
        yield body
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge
            if chunk:
                yield chunk
            if not message.get("more_body", False):
                return

    return stream()


async def _wait_for_disconnect(receive: Receive, upload: asyncio.Future[None] | None) -> None:
    """Return when the client goes away. While its body still streams, the upload owns `receive`."""
    if upload is not None:
        try:
            await asyncio.shield(upload)  # shielded: cancelling the watcher must not stop the upload
        except (ClientGone, BodyTooLarge, OSError):  # the upload failed: stop relaying the answer
            return
    while (await receive())["type"] != "http.disconnect":
        pass


def _sse_error(error: RouterError) -> bytes:
    return b"data: " + json.dumps(json.loads(error.body())).encode() + b"\n\n"


class HttpProxy:
    def __init__(self, ctx: RouterContext) -> None:
        self.ctx = ctx
        self.session_header = ctx.config.session_header.lower()
        self._session_header_bytes = self.session_header.encode()
        self.log_requests = ctx.config.log_requests

    def _log(
        self,
        scope: Scope,
        *,
        status: int,
        worker: str | None,
        binding: Binding | None,
        started: float,
        session: str | None = None,
    ) -> None:
        if self.log_requests and log.isEnabledFor(logging.INFO):
            fields = {
                "event": "request",
                "method": scope["method"],
                "path": scope["path"],
                "status": status,
                "worker": worker,
                "session": binding.session if binding else session,
                "bind": binding.kind.value if binding else None,
                "ms": round((time.perf_counter() - started) * 1000, 2),
            }
            logs.event(log, "request", fields)

    async def _fail(
        self,
        scope: Scope,
        send: Send,
        error: RouterError,
        *,
        worker: str | None,
        binding: Binding | None,
        started: float,
    ) -> None:
        worker = worker or error.worker
        self.ctx.metrics.errors.labels(worker or "", error.code).inc()
        await send_error(send, error)
        self._log(
            scope, status=error.status, worker=worker, binding=binding, started=started, session=error.session
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = self.ctx
        started = time.perf_counter()
        content_length, binding_headers, headers = scan_request_headers(scope, self._session_header_bytes)
        limit = ctx.config.max_body_bytes
        if content_length is not None and content_length > limit:
            await self._fail(
                scope, send, RouterError.too_large(limit=limit), worker=None, binding=None, started=started
            )
            return
        try:
            body = await _read_body(receive, await receive(), content_length=content_length, limit=limit)
        except ClientGone:
            return
        except BodyTooLarge:
            await self._fail(
                scope, send, RouterError.too_large(limit=limit), worker=None, binding=None, started=started
            )
            return
        try:
            binding = await ctx.bind(
                path=scope["path"],
                query=request_query(scope),
                headers=binding_headers,
            )
        except RouterError as refusal:
            await self._fail(scope, send, refusal, worker=None, binding=None, started=started)
            return
        target = request_target(scope)
        worker_id = binding.candidates[0]
        failed: list[str] = []
        while True:
            worker = ctx.table.get(worker_id)
            assert worker is not None  # bind() and retry_candidate() only name workers in the table
            ctx.open_session(worker_id)
            sent_at = time.perf_counter()
            try:
                response = await ctx.upstream.request(
                    base_url=worker.url, method=scope["method"], target=target, headers=headers, body=body
                )
            except UpstreamError as exc:
                ctx.close_session(worker_id)
                if isinstance(exc, UpstreamTimeout):
                    error = RouterError.worker_timeout(
                        worker_id=worker_id, seconds=ctx.config.upstream_timeout
                    )
                elif not exc.started:
                    ctx.health.mark_down(worker_id, f"request failed: {exc}")
                    failed.append(worker_id)
                    # Only a body the router holds whole can be sent again.
                    retry = (
                        retry_candidate(binding, failed=failed, table=ctx.table) if len(failed) == 1 else None
                    )
                    if retry is not None and isinstance(body, bytes):
                        ctx.metrics.retries.labels(worker_id).inc()
                        log.warning(
                            "retrying on another worker",
                            extra={
                                "fields": {
                                    "event": "retry",
                                    "worker": worker_id,
                                    "retry_worker": retry,
                                    "error": str(exc),
                                    "path": scope["path"],
                                }
                            },
                        )
                        worker_id = retry
                        continue
                    error = RouterError.worker_unreachable(worker_id=worker_id, detail=str(exc))
                else:
                    ctx.health.mark_down(worker_id, f"request failed: {exc}")
                    error = RouterError.worker_failed(worker_id=worker_id, detail=str(exc))
                await self._fail(scope, send, error, worker=worker_id, binding=binding, started=started)
                return
            except BodyTooLarge:
                ctx.close_session(worker_id)
                await self._fail(
                    scope,
                    send,
                    RouterError.too_large(limit=limit),
                    worker=worker_id,
                    binding=binding,
                    started=started,
                )
                return
            except ClientGone:
                ctx.close_session(worker_id)
                return
            if (
                binding.kind is not BindKind.SESSION
                and isinstance(body, bytes)  # only a body the router holds whole can be sent again
                and capacity_refused(response.headers, status=response.status)
            ):
                failed.append(worker_id)
                retry = retry_candidate(binding, failed=failed, table=ctx.table)
                if retry is not None:
                    await self._pass_over(response, worker_id=worker_id, retry=retry, path=scope["path"])
                    worker_id = retry
                    continue
            break
        ctx.metrics.observe_latency(worker_id, time.perf_counter() - sent_at)
        completed_at = 0.0
        try:
            status = await self._relay_response(receive, send, response, worker_id=worker_id)
            completed_at = response.completed_at  # read before the connection goes back to the pool
        finally:
            response.close()
            ctx.close_session(worker_id)
        if completed_at:
            # The router's own share of this request: all of it minus the worker's exchange.
            ctx.metrics.overhead.observe((time.perf_counter() - started) - (completed_at - sent_at))
        ctx.metrics.count_request(worker_id, status)
        self._log(scope, status=status, worker=worker_id, binding=binding, started=started)

    async def _pass_over(self, response: UpstreamResponse, *, worker_id: str, retry: str, path: str) -> None:
        """Drop a worker's refusal at speech capacity; the request goes to `retry` instead."""
        try:
            await response.read()  # small JSON: read it so the connection can be reused
        except UpstreamError:
            pass
        finally:
            response.close()
            self.ctx.close_session(worker_id)
        self.ctx.metrics.count_request(worker_id, 429)
        self.ctx.passed_over(worker_id, retry=retry, path=path)

    async def _relay_response(
        self, receive: Receive, send: Send, response: UpstreamResponse, *, worker_id: str
    ) -> int:
        headers: list[tuple[bytes, bytes]] = []
        length: bytes | None = None
        is_sse = False
        for name, value in response.headers:
            if name in HOP_BY_HOP:
                continue
            if name == b"content-length":
                length = value
            elif name == b"content-type":
                is_sse = value.startswith(b"text/event-stream")
            headers.append((name, value))
        headers.append((b"x-omni-worker", worker_id.encode()))
        if length is not None and length.isdigit() and int(length) <= WHOLE_BODY_LIMIT and not is_sse:
            try:
                data = await response.read()
            except UpstreamError as exc:
                self.ctx.health.mark_down(worker_id, f"response failed: {exc}")
                error = RouterError.worker_failed(worker_id=worker_id, detail=str(exc))
                self.ctx.metrics.errors.labels(worker_id, error.code).inc()
                await send_error(send, error)
                return error.status
            await send({"type": "http.response.start", "status": response.status, "headers": headers})
            await send({"type": "http.response.body", "body": data, "more_body": False})
            return response.status

        await send({"type": "http.response.start", "status": response.status, "headers": headers})

        async def pump() -> None:
            async for chunk in response.iter_chunks():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})

        pumping = asyncio.ensure_future(pump())
        watching = asyncio.ensure_future(_wait_for_disconnect(receive, response.upload))
        try:
            await asyncio.wait({pumping, watching}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server is shutting down
            pumping.cancel()
            watching.cancel()
            raise
        watching.cancel()
        if not pumping.done():
            pumping.cancel()  # the client left: closing the connection tells the worker to stop
            await asyncio.gather(pumping, return_exceptions=True)
            log.info(
                "client disconnected mid-stream",
                extra={"fields": {"event": "client_gone", "worker": worker_id}},
            )
            return response.status
        failure = pumping.exception()
        if failure is None:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return response.status
        if not isinstance(failure, UpstreamError):
            raise failure
        if response.upload_failed():  # the client's body broke off; the worker did nothing wrong
            return response.status
        self.ctx.health.mark_down(worker_id, f"stream failed: {failure}")
        error = RouterError.worker_failed(worker_id=worker_id, detail=f"stream ended early: {failure}")
        self.ctx.metrics.errors.labels(worker_id, error.code).inc()
        log.warning("worker stream failed", extra={"fields": {"event": "stream_failed", "worker": worker_id}})
        if is_sse:
            # The status line is long gone; an SSE client still learns what happened.
            await send({"type": "http.response.body", "body": _sse_error(error), "more_body": False})
        # Any other stream is left incomplete: the server closes the connection, the client sees
        # a truncated body rather than a silently shortened one.
        return response.status
