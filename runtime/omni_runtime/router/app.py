"""The router as one ASGI application: proxy, WebSocket relay, its own probes and the admin API.

`RouterApp` dispatches on the raw ASGI scope: the router's own endpoints (/health, /ready,
/metrics, /admin/...) go to a small Starlette app, WebSockets to the relay, every other HTTP
request to the proxy. The lifespan loads the worker table, runs one health round before serving
(so a router started next to ready workers routes at once), then keeps the source watch and the
health loop running until shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from omni_runtime.router import logs
from omni_runtime.router.auth import EXEMPT_PATHS, admin_refusal, authorized, is_admin_path
from omni_runtime.router.context import RouterConfig, RouterContext
from omni_runtime.router.errors import RouterError
from omni_runtime.router.health import HealthChecker
from omni_runtime.router.http_proxy import HttpProxy, Receive, Scope, Send, send_error
from omni_runtime.router.metrics import CONTENT_TYPE, RouterMetrics
from omni_runtime.router.metrics_merge import REPLICA_SCOPE, merge_metrics
from omni_runtime.router.sources import WorkerSource, WorkerTableError
from omni_runtime.router.table import Worker, WorkerSpec, WorkerState, WorkerTable
from omni_runtime.router.upstream_client import UpstreamPool
from omni_runtime.router.ws_relay import WebSocketRelay, deny_websocket
from omni_runtime.support.gc_pauses import freeze_heap, watch_gc

log = logging.getLogger("omni.router")

MAX_IDLE_WAIT_S = 300.0


def worker_json(worker: Worker) -> dict[str, Any]:
    return {
        "id": worker.id,
        "url": worker.url,
        "revision": worker.spec.revision,
        "state": worker.state.value,
        "source_state": worker.spec.state.value,
        "drained_by_admin": worker.drained_by_admin,
        "healthy": worker.healthy,
        "in_rotation": worker.in_rotation,
        "sessions": worker.sessions,
        "idle": worker.idle,
        "speech_full": worker.speech_full,
    }


def _error_response(error: RouterError) -> Response:
    return Response(error.body(), status_code=error.status, media_type="application/json")


def _unknown_worker(worker_id: str) -> Response:
    error = RouterError(
        status=404,
        code="worker_not_found",
        error_type="invalid_request_error",
        message=f"No worker {worker_id!r} in the router's table; GET /admin/workers lists them.",
    )
    return _error_response(error)


def _per_replica(config: RouterConfig, worker_id: str, action: str) -> Response | None:
    """With --processes N > 1 an admin drain or idle wait would see one replica of N: refuse it."""
    if config.processes <= 1:
        return None
    error = RouterError(
        status=409,
        code="router_has_replicas",
        error_type="invalid_request_error",
        message=f"This router runs {config.processes} processes (--processes); {action} over HTTP "
        "would reach only the one that answered. Drain through the worker table instead: set "
        f'"state": "draining" for {worker_id!r} in the --workers-file (every process re-reads it), '
        "or run the router with --processes 1.",
    )
    return _error_response(error)


class RouterApp:
    def __init__(
        self, *, config: RouterConfig, source: WorkerSource, initial: list[WorkerSpec] | None = None
    ) -> None:
        self.config = config
        self.source = source
        self.initial = initial
        self.table = WorkerTable(max_sessions_per_worker=config.max_sessions_per_worker)
        self.metrics = RouterMetrics(replica=config.replica, processes=config.processes)
        self.ctx: RouterContext | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._http: HttpProxy | None = None
        self._session_header = config.session_header.lower().encode()
        self._ws: WebSocketRelay | None = None
        self._control = Starlette(
            routes=[
                Route("/health", self._health),
                Route("/ready", self._ready),
                Route("/metrics", self._metrics),
                Route("/admin/workers", self._list_workers),
                Route("/admin/workers/{worker_id}", self._get_worker),
                Route("/admin/workers/{worker_id}/drain", self._drain, methods=["POST"]),
                Route("/admin/workers/{worker_id}/undrain", self._undrain, methods=["POST"]),
            ]
        )

    # ---- table updates -------------------------------------------------------------------

    def apply_snapshot(self, specs: list[WorkerSpec]) -> None:
        change = self.table.apply(specs)
        if change.added or change.changed or change.gone or change.dropped:
            log.info(
                "worker table changed",
                extra={
                    "fields": {
                        "event": "table",
                        "added": change.added,
                        "changed": change.changed,
                        "gone": change.gone,
                        "dropped": change.dropped,
                    }
                },
            )
        for worker_id in change.dropped:
            self.metrics.forget_worker(worker_id)
        if self.ctx is not None:
            for worker_id in change.gone:
                self.ctx.evict(worker_id, code=1012, reason=f"worker {worker_id} is gone")
            if change.added or change.changed:
                self.ctx.health.poke()

    def live_sessions(self) -> dict[str, int]:
        """Live sessions (open WebSockets plus in-flight requests) by worker id."""
        return {worker.id: worker.sessions for worker in self.table.workers()}

    # ---- lifespan ------------------------------------------------------------------------

    async def startup(self) -> None:
        specs = self.initial if self.initial is not None else await asyncio.to_thread(self.source.load)
        self.apply_snapshot(specs)
        health = HealthChecker(self.table, interval=self.config.health_interval)
        upstream = UpstreamPool(
            connect_timeout=self.config.connect_timeout, read_timeout=self.config.upstream_timeout
        )
        self.ctx = RouterContext(
            config=self.config,
            table=self.table,
            metrics=self.metrics,
            health=health,
            upstream=upstream,
        )
        self._http = HttpProxy(self.ctx)
        self._ws = WebSocketRelay(self.ctx)
        await health.check_once()
        watch_gc()
        if self.config.gc_freeze:
            freeze_heap("omni router")
        self._tasks = [
            asyncio.create_task(health.run(), name="health"),
            asyncio.create_task(self.source.watch(self.apply_snapshot), name="source"),
            asyncio.create_task(logs.flush_periodically(), name="log-flush"),
        ]
        # A source that can tell the operator about sessions on draining workers (Kubernetes) does.
        report_sessions = getattr(self.source, "report_sessions", None)
        if report_sessions is not None:
            self._tasks.append(asyncio.create_task(report_sessions(self.live_sessions), name="drain-reports"))
        log.info(
            "router started",
            extra={
                "fields": {
                    "event": "started",
                    "source": self.source.describe(),
                    "workers": [worker.id for worker in self.table.workers()],
                    "in_rotation": [worker.id for worker in self.table.in_rotation()],
                }
            },
        )

    async def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.ctx is not None:
            self.ctx.upstream.close()
            await self.ctx.health.aclose()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        await receive()  # lifespan.startup
        try:
            await self.startup()
        except WorkerTableError as exc:
            await send({"type": "lifespan.startup.failed", "message": str(exc)})
            return
        await send({"type": "lifespan.startup.complete"})
        await receive()  # lifespan.shutdown
        await self.shutdown()
        await send({"type": "lifespan.shutdown.complete"})

    # ---- dispatch ------------------------------------------------------------------------

    def _authorized(self, scope: Scope) -> bool:
        if not self.config.api_keys:
            return True
        return authorized(_authorization(scope), self.config.api_keys)

    def _refusal(self, scope: Scope) -> RouterError | None:
        """Why the router answers this request or WebSocket itself before anything else, if it does:
        a head over --max-header-bytes or a session key over its limit (431), the admin API without
        its credential (401/403), a missing client API key (401)."""
        config = self.config
        size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
        too_long_key = False
        for name, value in scope["headers"]:
            size += len(name) + len(value) + 4
            if name == self._session_header and len(value) > config.max_session_key_bytes:
                too_long_key = True
        if size > config.max_header_bytes:
            return RouterError.headers_too_large(limit=config.max_header_bytes)
        if too_long_key:
            return RouterError.session_key_too_long(
                header=config.session_header, limit=config.max_session_key_bytes
            )
        path = scope["path"]
        if is_admin_path(path):
            return admin_refusal(
                client=scope.get("client"),
                authorization=_authorization(scope),
                admin_keys=config.admin_keys,
                api_keys=config.api_keys,
            )
        exempt = scope["type"] == "http" and path in EXEMPT_PATHS
        if not exempt and not self._authorized(scope):
            return RouterError.unauthorized()
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if (refusal := self._refusal(scope)) is not None:
                await send_error(send, refusal)
                return
            path = scope["path"]
            if path in EXEMPT_PATHS or is_admin_path(path):
                await self._control(scope, receive, send)
                return
            assert self._http is not None, "router used before its lifespan started"
            await self._http(scope, receive, send)
        elif kind == "websocket":
            if (refusal := self._refusal(scope)) is not None:
                await receive()
                await deny_websocket(send, scope, refusal)
                return
            assert self._ws is not None, "router used before its lifespan started"
            await self._ws(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    # ---- the router's own endpoints ------------------------------------------------------

    async def _health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def _ready(self, request: Request) -> Response:
        if not self.table.in_rotation() and self.table.could_join_on_a_probe() and self.ctx is not None:
            await self.ctx.health.recheck()  # refuse on news, as a request would (RouterContext.bind)
        rotation = [worker.id for worker in self.table.in_rotation()]
        if not rotation:
            return _error_response(RouterError.no_ready_worker(known=[w.id for w in self.table.workers()]))
        return JSONResponse({"status": "ready", "workers_in_rotation": rotation})

    async def _metrics(self, request: Request) -> Response:
        body = self.metrics.render(self.table)
        directory, count = self.config.metrics_dir, self.config.processes
        if directory and count > 1 and request.query_params.get("scope") != REPLICA_SCOPE:
            others = [index for index in range(count) if index != self.config.replica]
            siblings = await asyncio.gather(*(_replica_metrics(directory, index) for index in others))
            body = merge_metrics([body.decode(), *(text for text in siblings if text is not None)])
        return Response(body, media_type=CONTENT_TYPE)

    async def _list_workers(self, request: Request) -> Response:
        workers = [worker_json(worker) for worker in self.table.workers()]
        # With --processes N, sessions are this process's own: say so next to them.
        return JSONResponse({"workers": workers, "router_processes": self.config.processes})

    async def _get_worker(self, request: Request) -> Response:
        """One worker; `?wait=S` holds the answer until the worker is idle or S seconds pass."""
        worker_id = request.path_params["worker_id"]
        try:
            wait = min(float(request.query_params.get("wait", "0")), MAX_IDLE_WAIT_S)
        except ValueError:
            error = RouterError(
                status=400,
                code="invalid_wait",
                error_type="invalid_request_error",
                message="wait: expected a number of seconds, e.g. ?wait=30",
            )
            return _error_response(error)
        if wait > 0 and (refused := _per_replica(self.config, worker_id, "waiting for idle")):
            return refused
        deadline = asyncio.get_running_loop().time() + wait
        while True:
            worker = self.table.get(worker_id)
            if worker is None:
                return _unknown_worker(worker_id)
            if worker.idle or asyncio.get_running_loop().time() >= deadline:
                return JSONResponse(worker_json(worker))
            await asyncio.sleep(0.05)

    async def _drain(self, request: Request) -> Response:
        worker_id = request.path_params["worker_id"]
        if refused := _per_replica(self.config, worker_id, "a drain"):
            return refused
        worker = self.table.drain(worker_id)
        if worker is None:
            return _unknown_worker(worker_id)
        log.info(
            "worker draining",
            extra={"fields": {"event": "drain", "worker": worker_id, "sessions": worker.sessions}},
        )
        return JSONResponse(worker_json(worker))

    async def _undrain(self, request: Request) -> Response:
        worker_id = request.path_params["worker_id"]
        if refused := _per_replica(self.config, worker_id, "an undrain"):
            return refused
        worker = self.table.undrain(worker_id)
        if worker is None:
            return _unknown_worker(worker_id)
        log.info("worker back in service", extra={"fields": {"event": "undrain", "worker": worker_id}})
        return JSONResponse(worker_json(worker))


__all__ = ["RouterApp", "RouterConfig", "WorkerState", "worker_json"]


def _authorization(scope: Scope) -> bytes | None:
    return next((value for name, value in scope["headers"] if name == b"authorization"), None)


async def _replica_metrics(directory: str, index: int) -> str | None:
    """A sibling replica's own series, over its private socket; None while it is (re)starting."""
    from omni_runtime.router.replicas import replica_socket_path

    transport = httpx.AsyncHTTPTransport(uds=str(replica_socket_path(directory, index)))
    try:
        async with httpx.AsyncClient(transport=transport, timeout=2.0, trust_env=False) as client:
            response = await client.get(f"http://replica-{index}/metrics", params={"scope": REPLICA_SCOPE})
            response.raise_for_status()
            return response.text
    except (httpx.HTTPError, OSError) as exc:
        log.info("replica %d left out of /metrics: %s", index, type(exc).__name__)
        return None
