"""`omni router --processes N`: replicas on one port, drains through the worker table, admin drains
refused with 409, a crashed replica restarted, everything stopped with the parent."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from conftest import Cluster, Router, wait_until


def replica_pids(router: Router) -> list[int]:
    path = Path(f"/proc/{router.popen.pid}/task/{router.popen.pid}/children")
    try:
        return [int(pid) for pid in path.read_text().split()]
    except OSError:
        return []


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def worker_of_fresh_connections(router: Router, count: int) -> list[str]:
    """The worker behind `count` requests, each on a new connection (so on any replica)."""
    answered = []
    for _ in range(count):
        with httpx.Client(trust_env=False, timeout=5.0) as client:
            response = client.post(f"{router.url}/whoami")
            assert response.status_code == 200, response.text
            answered.append(response.headers["x-omni-worker"])
    return answered


def test_replicas_share_the_port_and_drain_through_the_worker_table(cluster: Cluster) -> None:
    upstreams = cluster.upstreams("w0", "w1")
    workers = cluster.write_workers([u.entry() for u in upstreams])
    router = cluster.router(workers, "--processes", "3")
    router.wait_rotation({"w0", "w1"})
    wait_until(lambda: len(replica_pids(router)) == 3, timeout=30, what="3 replicas", log=router.log)

    assert set(worker_of_fresh_connections(router, 12)) == {"w0", "w1"}
    # /metrics is the whole router's, whichever replica the scrape reaches: its siblings' series
    # are merged in (the 12 requests above went to all three).
    for _ in range(6):
        with httpx.Client(trust_env=False, timeout=5.0) as client:  # a new connection each time
            text = client.get(f"{router.url}/metrics").text
        found = samples(text)
        replicas = sorted(
            dict(labels)["replica"] for name, labels in found if name == "omni_router_replica_info"
        )
        assert replicas == ["0", "1", "2"]
        assert sum(v for (name, _), v in found.items() if name == "omni_router_requests_total") == 12
        assert found[("omni_router_overhead_seconds_count", ())] == 12
    with connect(f"{router.ws}/ws", proxy=None) as ws:
        ws.send("hello")
        assert ws.recv(timeout=10)

    drain = httpx.post(f"{router.url}/admin/workers/w0/drain", trust_env=False)
    assert drain.status_code == 409
    error = drain.json()["error"]
    assert error["code"] == "router_has_replicas"
    assert "--workers-file" in error["message"] and "'w0'" in error["message"]
    wait = httpx.get(f"{router.url}/admin/workers/w0", params={"wait": "1"}, trust_env=False)
    assert wait.status_code == 409
    listing = httpx.get(f"{router.url}/admin/workers", trust_env=False).json()
    assert listing["router_processes"] == 3

    # The drain every replica sees: the worker table.
    cluster.write_workers([upstreams[0].entry("draining"), upstreams[1].entry()])
    wait_until(
        lambda: set(worker_of_fresh_connections(router, 9)) == {"w1"},
        timeout=20,
        what="every replica sending new requests to w1 only",
        log=router.log,
    )


def test_a_crashed_replica_is_restarted_and_the_parent_stops_them_all(cluster: Cluster) -> None:
    (upstream,) = cluster.upstreams("w0")
    router = cluster.router(cluster.write_workers([upstream.entry()]), "--processes", "2")
    router.wait_rotation({"w0"})
    wait_until(lambda: len(replica_pids(router)) == 2, timeout=30, what="2 replicas", log=router.log)
    first, _ = replica_pids(router)

    os.kill(first, signal.SIGKILL)
    wait_until(
        lambda: len(pids := replica_pids(router)) == 2 and first not in pids,
        timeout=30,
        what="the killed replica restarted",
        log=router.log,
    )
    wait_until(
        lambda: worker_of_fresh_connections(router, 6) == ["w0"] * 6,
        timeout=30,
        what="requests answered on every replica",
        log=router.log,
    )
    restarts = [
        json.loads(line) for line in router.log.read_text().splitlines() if '"replica_restart"' in line
    ]
    assert [(r["level"], r["exit_code"]) for r in restarts] == [("warning", -9)]
    assert re.fullmatch(r"replica [01] exited with -9; restarting it", restarts[0]["msg"])

    replicas = replica_pids(router)
    router.popen.send_signal(signal.SIGTERM)
    assert router.popen.wait(timeout=30) == 0
    for pid in replicas:
        wait_until(lambda pid=pid: not Path(f"/proc/{pid}").exists(), timeout=10, what=f"replica {pid} gone")
