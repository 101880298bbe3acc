"""WebSocket sessions through the router: bind at the upgrade, relay both ways, never move.

The router opens the worker's WebSocket first and accepts the client only when the worker has
accepted, so the worker's subprotocol choice and any refusal (its status and body) reach the client
as they are. Then two pumps copy text and binary frames in each direction until one side closes;
the close code and reason are passed to the other side. A worker whose handshake says it is at its
speech stream limit (`binding.capacity_refused`; it then sends an error event and closes with 1013)
is passed over for the next untried candidate of an unpinned session; the last one is relayed. A worker connection that drops without a
close frame (the worker died) closes the client with 1011 and a reason naming the worker; a worker
that is removed from the table closes its sessions with 1012. Pings are per hop: ASGI answers the
client's pings, and the router pings the worker to notice a silent death within two intervals.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from omni_runtime.router.binding import Binding, BindKind, capacity_refused, retry_candidate
from omni_runtime.router.context import HOP_BY_HOP, RouterContext
from omni_runtime.router.errors import RouterError
from omni_runtime.router.http_proxy import Receive, Scope, Send, header_map, request_query, request_target

log = logging.getLogger("omni.router")

_WS_HANDSHAKE = frozenset(
    {
        b"sec-websocket-key",
        b"sec-websocket-version",
        b"sec-websocket-extensions",
        b"sec-websocket-protocol",
        b"user-agent",
    }
)
_DROP = HOP_BY_HOP | _WS_HANDSHAKE
# Codes an endpoint may put in a close frame (RFC 6455 section 7.4): not 1004-1006 or 1015.
_SENDABLE = frozenset({1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014})
_connections = itertools.count(1)


def sendable_close(code: int | None, reason: str, *, fallback: tuple[int, str]) -> tuple[int, str]:
    """A close code and reason that may go on the wire; reasons are capped at 123 bytes."""
    if code is None or code == 1005:  # closed without a status: a normal close
        code, reason = 1000, reason
    elif code not in _SENDABLE and not 3000 <= code <= 4999:
        code, reason = fallback
    return code, reason.encode()[:123].decode(errors="ignore")


def client_departure(code: int | None, reason: str) -> tuple[int, str]:
    """The close the worker gets when the client's side of a relayed socket ends.

    A client that closed with a status of its own passes it on. One that left without a status
    (uvicorn reports a dropped TCP connection as 1005 as well as 1006) is "going away" (1001), so
    the worker treats it as a drop, not a goodbye: a duplex session then waits for its resume
    instead of ending. Passing 1005 on as a normal close (1000) made that depend on which side
    noticed the drop first."""
    if code is None or code in (1005, 1006):
        return 1001, "client went away"
    return sendable_close(code, reason, fallback=(1001, "client went away"))


def ws_url(base_url: str, scope: Scope) -> str:
    target = base_url + request_target(scope)
    return "wss" + target[5:] if target.startswith("https") else "ws" + target[4:]


async def deny_websocket(send: Send, scope: Scope, error: RouterError) -> None:
    if "websocket.http.response" in scope.get("extensions", {}):
        await send(
            {"type": "websocket.http.response.start", "status": error.status, "headers": error.headers()}
        )
        await send({"type": "websocket.http.response.body", "body": error.body()})
    else:
        await send({"type": "websocket.close", "code": 1013, "reason": error.message[:123]})


class WebSocketRelay:
    def __init__(self, ctx: RouterContext) -> None:
        self.ctx = ctx
        self.session_header = ctx.config.session_header.lower()

    async def _open_upstream(
        self, scope: Scope, send: Send, binding: Binding
    ) -> tuple[str, ClientConnection] | None:
        ctx = self.ctx
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"] if k not in _DROP]
        subprotocols = scope.get("subprotocols") or None
        worker_id = binding.candidates[0]
        failed: list[str] = []
        while True:
            worker = ctx.table.get(worker_id)
            assert worker is not None  # bind() and retry_candidate() only name workers in the table
            try:
                upstream = await connect(
                    ws_url(worker.url, scope),
                    additional_headers=headers,
                    subprotocols=subprotocols,
                    user_agent_header=None,
                    open_timeout=ctx.config.connect_timeout,
                    ping_interval=ctx.config.ws_ping_interval,
                    ping_timeout=ctx.config.ws_ping_interval,
                    max_size=ctx.config.max_body_bytes,
                    compression=None,  # loopback or cluster network: CPU matters more than bytes
                    proxy=None,
                )
                retry = self._capacity_retry(
                    upstream, binding, failed=failed, worker_id=worker_id, path=scope["path"]
                )
                if retry is None:
                    return worker_id, upstream
                await upstream.close(1000, "router: trying another worker")
                worker_id = retry
                continue
            except InvalidStatus as exc:  # the worker refused the upgrade: pass its answer on
                response = exc.response
                ctx.metrics.count_request(worker_id, response.status_code)
                if "websocket.http.response" in scope.get("extensions", {}):
                    kept = [
                        (k.lower().encode(), v.encode())
                        for k, v in response.headers.raw_items()
                        if k.lower().encode() not in HOP_BY_HOP
                    ]
                    await send(
                        {
                            "type": "websocket.http.response.start",
                            "status": response.status_code,
                            "headers": kept,
                        }
                    )
                    await send({"type": "websocket.http.response.body", "body": response.body or b""})
                else:
                    await send(
                        {
                            "type": "websocket.close",
                            "code": 1008,
                            "reason": f"worker refused: {response.status_code}",
                        }
                    )
                return None
            except (OSError, TimeoutError, InvalidHandshake) as exc:
                ctx.health.mark_down(worker_id, f"websocket connect failed: {type(exc).__name__}")
                failed.append(worker_id)
                retry = retry_candidate(binding, failed=failed, table=ctx.table) if len(failed) == 1 else None
                if retry is not None:
                    ctx.metrics.retries.labels(worker_id).inc()
                    log.warning(
                        "retrying on another worker",
                        extra={
                            "fields": {
                                "event": "retry",
                                "worker": worker_id,
                                "retry_worker": retry,
                                "error": type(exc).__name__,
                            }
                        },
                    )
                    worker_id = retry
                    continue
                error = RouterError.worker_unreachable(worker_id=worker_id, detail=type(exc).__name__)
                ctx.metrics.errors.labels(worker_id, error.code).inc()
                await deny_websocket(send, scope, error)
                return None

    def _capacity_retry(
        self, upstream: ClientConnection, binding: Binding, *, failed: list[str], worker_id: str, path: str
    ) -> str | None:
        """The next candidate when this worker refused the session at speech capacity, else None."""
        response = upstream.response
        if binding.kind is BindKind.SESSION or response is None:
            return None
        headers = [(k.lower().encode(), v.encode()) for k, v in response.headers.raw_items()]
        if not capacity_refused(headers):
            return None
        failed.append(worker_id)
        retry = retry_candidate(binding, failed=failed, table=self.ctx.table)
        if retry is not None:
            self.ctx.passed_over(worker_id, retry=retry, path=path)
        return retry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = self.ctx
        if (await receive())["type"] != "websocket.connect":
            return
        try:
            binding = await ctx.bind(
                path=scope["path"],
                query=request_query(scope),
                headers=header_map(scope, self.session_header.encode()),
            )
        except RouterError as error:
            ctx.metrics.errors.labels(error.worker or "", error.code).inc()
            await deny_websocket(send, scope, error)
            return
        opened = await self._open_upstream(scope, send, binding)
        if opened is None:
            return
        worker_id, upstream = opened
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
        ctx.open_session(worker_id)
        evicted: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()
        ctx.relays.setdefault(worker_id, set()).add(evicted)
        connection = next(_connections)
        fields = {
            "worker": worker_id,
            "session": binding.session,
            "connection": connection,
            "path": scope["path"],
        }
        log.info(
            "websocket bound", extra={"fields": {"event": "ws_bound", "bind": binding.kind.value, **fields}}
        )
        started = time.perf_counter()
        try:
            closed_by, code, reason = await self._relay(receive, send, upstream, evicted, worker_id=worker_id)
        finally:
            ctx.relays.get(worker_id, set()).discard(evicted)
            ctx.close_session(worker_id)
        ctx.metrics.count_request(worker_id, 101)
        log.info(
            "websocket closed",
            extra={
                "fields": {
                    "event": "ws_closed",
                    "closed_by": closed_by,
                    "code": code,
                    "reason": reason,
                    "seconds": round(time.perf_counter() - started, 3),
                    **fields,
                }
            },
        )

    async def _relay(
        self,
        receive: Receive,
        send: Send,
        upstream: ClientConnection,
        evicted: asyncio.Future[tuple[int, str]],
        *,
        worker_id: str,
    ) -> tuple[str, int, str]:
        lost = (1011, f"worker {worker_id} connection lost")

        def upstream_closed(exc: ConnectionClosed) -> tuple[str, int, str]:
            if exc.rcvd is None:
                return ("worker_lost", *lost)
            return ("worker", exc.rcvd.code, exc.rcvd.reason)

        async def client_to_worker() -> tuple[str, int, str]:
            while True:
                message = await receive()
                kind = message["type"]
                try:
                    if kind == "websocket.receive":
                        text = message.get("text")
                        await upstream.send(text if text is not None else message.get("bytes") or b"")
                    elif kind == "websocket.disconnect":
                        return ("client", message.get("code", 1005), message.get("reason") or "")
                except ConnectionClosed as exc:
                    return upstream_closed(exc)

        async def worker_to_client() -> tuple[str, int, str]:
            while True:
                try:
                    data = await upstream.recv()
                except ConnectionClosed as exc:
                    return upstream_closed(exc)
                try:
                    if isinstance(data, str):
                        await send({"type": "websocket.send", "text": data})
                    else:
                        await send({"type": "websocket.send", "bytes": data})
                except OSError:  # uvicorn's ClientDisconnected: the client is gone
                    return ("client", 1006, "")

        async def eviction() -> tuple[str, int, str]:
            code, reason = await evicted
            return ("router", code, reason)

        tasks = [asyncio.ensure_future(pump()) for pump in (client_to_worker, worker_to_client, eviction)]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        closed_by, code, reason = next(task for task in tasks if task in done).result()

        if closed_by == "client":
            worker_code, worker_reason = client_departure(code, reason)
            await upstream.close(worker_code, worker_reason)
            return closed_by, code, reason
        if closed_by == "router":
            await upstream.close(1001, "router closed the session")
        if closed_by == "worker_lost":
            self.ctx.health.mark_down(worker_id, "websocket connection lost")
            self.ctx.metrics.errors.labels(worker_id, "worker_connection_lost").inc()
        client_code, client_reason = sendable_close(code, reason, fallback=lost)
        with contextlib.suppress(OSError):  # the client may have left at the same moment
            await send({"type": "websocket.close", "code": client_code, "reason": client_reason})
        return closed_by, client_code, client_reason
