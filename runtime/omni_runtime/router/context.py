"""The router's settings and the shared state its HTTP proxy, WebSocket relay and admin API use."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from omni_runtime.router.binding import Binding, bind
from omni_runtime.router.errors import RouterError
from omni_runtime.router.health import HealthChecker
from omni_runtime.router.metrics import RouterMetrics
from omni_runtime.router.table import WorkerTable
from omni_runtime.router.upstream_client import UpstreamPool

log = logging.getLogger("omni.router")

# Headers that describe one hop, not the message (RFC 9110 section 7.6.1), plus the ones the
# client libraries set themselves for the next hop.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"expect",  # the router has the whole body or streams it; no 100-continue to the worker
    }
)


@dataclass(frozen=True)
class RouterConfig:
    session_header: str = "X-Session-Id"
    max_sessions_per_worker: int = 0  # 0: no limit
    max_body_bytes: int = 100 * 1024 * 1024
    upstream_timeout: float = 600.0  # seconds a worker may stay silent (per read), SSE gaps included
    connect_timeout: float = 5.0
    health_interval: float = 1.0
    api_keys: tuple[bytes, ...] = ()  # empty: no client authentication
    admin_keys: tuple[bytes, ...] = ()  # empty: the admin API answers on loopback only
    max_header_bytes: int = 64 * 1024  # request line plus headers; more is answered 431
    max_session_key_bytes: int = 256  # the session-key header; longer is answered 431
    ws_ping_interval: float = 20.0  # keepalive pings on the router-to-worker WebSocket
    log_requests: bool = True  # one JSON line per proxied request
    processes: int = 1  # router replicas sharing the port (--processes); admin drains need 1
    replica: int = 0  # this process's index among them
    metrics_dir: str | None = None  # the replicas' private sockets, for one merged /metrics
    gc_freeze: bool = False  # `omni router` freezes its startup heap (omni_runtime.support.gc_pauses)


@dataclass
class RouterContext:
    config: RouterConfig
    table: WorkerTable
    metrics: RouterMetrics
    health: HealthChecker
    upstream: UpstreamPool
    # Live WebSocket relays by worker: a future per relay that, when set to (code, reason), makes
    # the relay close its client with that code (a worker that is gone ends its sessions cleanly).
    relays: dict[str, set[asyncio.Future[tuple[int, str]]]] = field(default_factory=dict)

    async def bind(self, *, path: str, query: Mapping[str, str], headers: Mapping[str, str]) -> Binding:
        """Where a new request or WebSocket goes (`binding.bind`). One that finds no worker in
        rotation first waits for a fresh health round (`HealthChecker.recheck`), then is refused."""
        header = self.config.session_header

        def decide() -> Binding:
            return bind(self.table, path=path, query=query, headers=headers, session_header=header)

        try:
            return decide()
        except RouterError as refusal:
            if refusal.code != "no_ready_worker" or not self.table.could_join_on_a_probe():
                raise
        await self.health.recheck()
        return decide()

    def open_session(self, worker_id: str) -> None:
        self.table.open_session(worker_id)  # /metrics reads live sessions from the table

    def passed_over(self, worker_id: str, *, retry: str, path: str) -> None:
        """Count and log a new request or session that `worker_id` refused at its speech stream limit
        and that goes to `retry` instead (http_proxy, ws_relay)."""
        self.metrics.retries.labels(worker_id).inc()
        fields = {"event": "capacity_retry", "worker": worker_id, "retry_worker": retry, "path": path}
        log.info("worker at speech capacity; trying another", extra={"fields": fields})

    def close_session(self, worker_id: str) -> None:
        if self.table.close_session(worker_id):
            self.metrics.forget_worker(worker_id)
            log.info(
                "worker left the table", extra={"fields": {"event": "worker_dropped", "worker": worker_id}}
            )

    def evict(self, worker_id: str, *, code: int, reason: str) -> int:
        """Close every live WebSocket on a worker with a code and reason; returns how many."""
        futures = self.relays.get(worker_id, set())
        count = 0
        for future in futures:
            if not future.done():
                future.set_result((code, reason))
                count += 1
        return count
