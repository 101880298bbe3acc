"""Merging the replicas' /metrics of `omni router --processes N` into one router's series."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from omni_runtime.router.metrics import RouterMetrics
from omni_runtime.router.metrics_merge import merge_metrics
from omni_runtime.router.table import WorkerSpec, WorkerState, WorkerTable


def replica(index: int, *, requests: int, sessions: int, healthy: bool, overhead: list[float]) -> str:
    table = WorkerTable()
    table.apply([WorkerSpec(id="w0", url="http://w0.test:8000", revision="r1", state=WorkerState.ready)])
    table.set_health("w0", healthy)
    for _ in range(sessions):
        table.open_session("w0")
    metrics = RouterMetrics(replica=index, processes=2)
    for _ in range(requests):
        metrics.count_request("w0", 200)
    for seconds in overhead:
        metrics.overhead.observe(seconds)
    return metrics.render(table).decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_two_replicas_read_as_one_router() -> None:
    merged = merge_metrics(
        [
            replica(0, requests=3, sessions=1, healthy=True, overhead=[0.0002, 0.004]),
            replica(1, requests=5, sessions=2, healthy=False, overhead=[0.0002]),
        ]
    ).decode()
    got = samples(merged)
    assert got[("omni_router_requests_total", (("status", "200"), ("worker", "w0")))] == 8
    assert got[("omni_router_sessions", (("worker", "w0"),))] == 3
    # In rotation when any replica has it there.
    assert got[("omni_router_worker_in_rotation", (("state", "ready"), ("worker", "w0")))] == 1
    assert got[("omni_router_overhead_seconds_count", ())] == 3
    assert got[("omni_router_overhead_seconds_bucket", (("le", "0.00025"),))] == 2
    assert got[("omni_router_overhead_seconds_bucket", (("le", "+Inf"),))] == 3
    # Each replica's identity passes through.
    assert got[("omni_router_replica_info", (("processes", "2"), ("replica", "0")))] == 1
    assert got[("omni_router_replica_info", (("processes", "2"), ("replica", "1")))] == 1
    # Still valid exposition text, counters typed as counters.
    assert "# TYPE omni_router_requests_total counter" in merged
    assert "# TYPE omni_router_overhead_seconds histogram" in merged


def test_one_text_merges_to_itself() -> None:
    text = replica(0, requests=2, sessions=0, healthy=True, overhead=[])
    assert samples(merge_metrics([text]).decode()) == samples(text)


def test_each_replica_says_which_it_is() -> None:
    text = replica(2, requests=0, sessions=0, healthy=True, overhead=[])
    assert samples(text)[("omni_router_replica_info", (("processes", "2"), ("replica", "2")))] == 1
