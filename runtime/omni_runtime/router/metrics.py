"""The router's Prometheus metrics, in a registry of its own.

A private registry (not the process-global one) lets several routers live in one process, as they
do in tests and in the benchmark, without duplicate-metric errors.
"""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from omni_runtime.router.table import WorkerTable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Upstream time to response headers: sub-millisecond on loopback up to long model prefills.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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
        self.errors = Counter(
            "omni_router_errors",
            "Requests and sessions the router ended with an error, by worker and error code.",
            ["worker", "code"],
            registry=self.registry,
        )
        self.retries = Counter(
            "omni_router_retries",
            "Requests retried on another worker after a connection error, by the worker that failed.",
            ["worker"],
            registry=self.registry,
        )

        # Label lookups cost a few microseconds each; the hot path reuses the children it made.
        self._children: dict[tuple[str, ...], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (metric._name, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def set_sessions(self, worker_id: str, count: int) -> None:
        self._child(self.sessions, worker_id).set(count)

    def observe_latency(self, worker_id: str, seconds: float) -> None:
        self._child(self.latency, worker_id).observe(seconds)

    def count_request(self, worker_id: str, status: int) -> None:
        self._child(self.requests, worker_id, str(status)).inc()

    def forget_worker(self, worker_id: str) -> None:
        """A worker left the table: drop its series so /metrics does not grow with every rollout."""
        self._children = {key: child for key, child in self._children.items() if worker_id not in key[1:]}
        for metric in (self.sessions, self.latency):
            with contextlib.suppress(KeyError):
                metric.remove(worker_id)

    def render(self, table: WorkerTable) -> bytes:
        # Rotation is a property of the whole table; refresh it at scrape time rather than on
        # every health change.
        self.worker_up.clear()
        for worker in table.workers():
            self.worker_up.labels(worker.id, worker.state.value).set(1 if worker.in_rotation else 0)
        return generate_latest(self.registry)
