"""The router benchmark end to end, briefly: a tiny-checkpoint worker and the echo upstream, each
measured direct and through a real `omni router`, with a few requests per case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_bench_measures_direct_and_routed_rows_for_worker_and_echo(tmp_path: Path) -> None:
    from omni_runtime.bench.router import run as bench
    from omni_runtime.models.qwen2_5_omni.tiny import ensure_tiny_checkpoint

    ensure_tiny_checkpoint(progress=False)
    argv = ["--out", str(tmp_path), "--upstream", "worker,echo", "--seconds", "0.4", "--rounds", "1"]
    argv += ["--concurrency", "1,3", "--ws-concurrency", "2", "--max-tokens", "2", "--device", "cpu"]
    assert bench.main(argv) == 0

    report = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "router_overhead.png").stat().st_size > 0
    assert report["scenarios"]["worker"]["shapes_match"] == {
        "chat": True,
        "chat_stream": True,
        "ws_realtime": True,
    }
    assert report["scenarios"]["worker"]["shape_differences"] == {}
    # Full garbage collections during the loads are read from each process's /metrics (the echo
    # upstream has none to report).
    for scenario in ("worker", "echo"):
        pauses = report["scenarios"][scenario]["gc_pauses"]
        assert set(pauses) == {"upstream", "router"}
        assert all(v["full_collections"] >= 0 and v["seconds"] >= 0 for v in pauses.values())
    assert report["scenarios"]["echo"]["gc_pauses"]["upstream"] == {"full_collections": 0, "seconds": 0.0}
    rows = {(r["scenario"], r["case"], r["concurrency"], r["target"]): r for r in report["results"]}
    expected_loads = [
        ("worker", "chat", 1),
        ("worker", "chat", 3),
        ("worker", "chat_stream", 1),
        ("worker", "chat_stream", 3),
        ("worker", "ws_realtime", 2),
        ("echo", "chat", 1),
        ("echo", "chat", 3),
        ("echo", "ws_echo", 2),
    ]
    assert sorted(rows) == sorted(
        (*load, target) for load in expected_loads for target in ("direct", "router")
    )
    for key, row in rows.items():
        assert row["per_second"] > 0 and row["count"] > 0, key
        assert row["errors"] == 0, key
        assert row["p99_ms"] >= row["p50_ms"] > 0, key
        # HTTP through the router: its own time per request, from its overhead histogram.
        if key[3] == "router" and not key[1].startswith("ws"):
            assert 0 < row["router_own_p99_ms"] < 1000, key
        else:
            assert row["router_own_p99_ms"] == 0, key
    for target in ("direct", "router"):
        streamed = rows[("worker", "chat_stream", 1, target)]
        # The first chunk comes before the whole stream has ended.
        assert 0 < streamed["first_chunk_p50_ms"] <= streamed["p50_ms"]
