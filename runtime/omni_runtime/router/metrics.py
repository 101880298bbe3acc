"""The router's Prometheus metrics, in a registry of its own.

A private registry (not the process-global one) lets several routers live in one process, as they
do in tests and in the benchmark, without duplicate-metric errors.

Each process of `omni router --processes N` keeps its own series and says which replica it is
(`omni_router_replica_info{replica, processes}`); the replica a scrape reaches answers with every
replica's series merged (metrics_merge.py).
"""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

from omni_runtime.router.table import WorkerTable
from omni_runtime.support.gc_pauses import GcPauses

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Upstream time to response headers: sub-millisecond on loopback up to long model prefills.
# The router's own time per request: tens of microseconds when idle, milliseconds when its loop is busy.
OVERHEAD_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0015,
    0.002,
    0.003,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class RouterMetrics:
    def __init__(self, *, replica: int = 0, processes: int = 1) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(GcPauses("omni_router"))  # the process's collections, timed once it serves
        Info(
            "omni_router_replica",
            "Which process of `omni router --processes N` answered this scrape.",
            registry=self.registry,
        ).info({"replica": str(replica), "processes": str(processes)})
        self.sessions = Gauge(
            "omni_router_sessions",
            "Live sessions per worker: open WebSockets and in-flight HTTP requests.",
            ["worker"],
            registry=self.registry,
        )
        self.worker_up = Gauge(
            "omni_router_worker_in_rotation",
            "1 when the worker takes new sessions (ready, not draining, passing /ready).",
            ["worker", "state"],
            registry=self.registry,
        )
        self.requests = Counter(
            "omni_router_requests",
            "Requests proxied, by worker and HTTP status (101 for WebSocket sessions).",
            ["worker", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "omni_router_upstream_latency_seconds",
            "Time from sending a request to a worker until its response headers arrive.",
            ["worker"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.overhead = Histogram(
            "omni_router_overhead_seconds",
            "Time an HTTP request spent in the router itself: from its arrival to the last byte sent"
            " to the client, less the worker's exchange (request sent to last response byte received).",
            buckets=OVERHEAD_BUCKETS,
            registry=self.registry,
        )
        self.errors = Counter(
            "omni_router_errors",
            "Requests and sessions the router ended with an error, by worker and error code.",
            ["worker", "code"],
            registry=self.registry,
        )
        self.retries = Counter(
            "omni_router_retries",
            "Requests retried on another worker after a connection error or a refusal at speech capacity, by the worker that failed or refused.",
            ["worker"],
            registry=self.registry,
        )

        # Label lookups cost a few microseconds each; the hot path keeps the children it made.
        self._latency: dict[str, Any] = {}
        self._requests: dict[tuple[str, int], Any] = {}

    def observe_latency(self, worker_id: str, seconds: float) -> None:
        child = self._latency.get(worker_id)
        if child is None:
            child = self._latency[worker_id] = self.latency.labels(worker_id)
        child.observe(seconds)

    def count_request(self, worker_id: str, status: int) -> None:
        child = self._requests.get((worker_id, status))
        if child is None:
            child = self._requests[(worker_id, status)] = self.requests.labels(worker_id, str(status))
        child.inc()

    def forget_worker(self, worker_id: str) -> None:
        """A worker left the table: drop its series so /metrics does not grow with every rollout."""
        self._latency.pop(worker_id, None)
        self._requests = {key: child for key, child in self._requests.items() if key[0] != worker_id}
        with contextlib.suppress(KeyError):
            self.latency.remove(worker_id)

    def render(self, table: WorkerTable) -> bytes:
        # Rotation and live sessions are properties of the table; read them at scrape time rather
        # than updating gauges on every health change and every request.
        self.worker_up.clear()
        self.sessions.clear()
        for worker in table.workers():
            self.worker_up.labels(worker.id, worker.state.value).set(1 if worker.in_rotation else 0)
            self.sessions.labels(worker.id).set(worker.sessions)
        return generate_latest(self.registry)
