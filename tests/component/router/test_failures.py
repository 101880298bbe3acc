"""Failures through a real router process: dead workers, retries, departing clients, auth, limits."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from conftest import Cluster, wait_until
from omni_runtime.router.health import RECHECK_FRESH_S

pytestmark = pytest.mark.timeout(120)


async def open_ws(router, path: str = "/ws", **kwargs):
    ws = await connect(f"{router.ws}{path}", proxy=None, **kwargs)
    hello = json.loads(await ws.recv())
    return ws, hello["worker"]


async def test_killing_a_worker_mid_session_gives_a_clean_error_and_leaves_others_untouched(pair):
    router, upstreams = pair
    doomed_ws, victim = await open_ws(router)
    survivor_ws, survivor = await open_ws(router)
    assert {victim, survivor} == {"w0", "w1"}
    by_id = {u.worker_id: u for u in upstreams}
    async with httpx.AsyncClient(base_url=router.url, trust_env=False, timeout=10) as client:
        session = None
        while session is None:  # a streaming-input session that lives on the victim
            created = (await client.post("/v1/streaming_input/sessions")).json()
            session = created["session_id"] if created["worker"] == victim else None
        async with client.stream(
            "GET", "/sse", params={"n": 100, "delay": 0.1, "session_id": session}
        ) as stream:
            assert stream.headers["x-omni-worker"] == victim
            lines = stream.aiter_lines()
            assert (await anext(lines)).startswith("data: ")
            by_id[victim].kill()
            killed_at = time.monotonic()
            # The WebSocket on the dead worker is closed with 1011 and a reason naming it.
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await asyncio.wait_for(doomed_ws.recv(), timeout=5)
            assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (
                1011,
                f"worker {victim} connection lost",
            )
            # The SSE stream on the dead worker ends with an error event instead of hanging.
            rest = [line async for line in lines if line.startswith("data: ")]
            assert time.monotonic() - killed_at < 5
            error = json.loads(rest[-1][len("data: ") :])["error"]
            assert error["code"] == "worker_failed"
            assert victim in error["message"]
        # The other worker's session is untouched.
        await survivor_ws.send("ping")
        assert await survivor_ws.recv() == f"{survivor}:ping"
        # A follow-up of the victim's session gets a clear 503, not a hang or another worker.
        follow_up = await client.post(f"/v1/streaming_input/sessions/{session}/chunks")
        assert follow_up.status_code == 503
        assert follow_up.json()["error"]["code"] == "worker_unreachable"
        # New work goes to the survivor.
        assert {(await client.get("/whoami")).json()["worker"] for _ in range(5)} == {survivor}
    assert router.workers()[victim]["in_rotation"] is False
    assert router.metric("omni_router_errors_total", worker=victim, code="worker_connection_lost") == 1
    await survivor_ws.close()


async def test_a_request_that_cannot_connect_is_retried_once_on_another_worker(cluster: Cluster):
    w0, w1, w2 = cluster.upstreams("w0", "w1", "w2")
    # A long health interval: the router learns of each death only from the failed connection.
    router = cluster.router(
        cluster.write_workers([u.entry() for u in (w0, w1, w2)]), "--health-interval", "60"
    )
    router.wait_rotation({"w0", "w1", "w2"})
    async with httpx.AsyncClient(base_url=router.url, trust_env=False, timeout=10) as client:
        w0.kill()  # the least-loaded first choice (all idle: lowest id)
        echoed = await client.post("/echo", content=b"payload")
        assert echoed.status_code == 200
        assert echoed.json() == {"worker": "w1", "size": 7, "body": "payload"}  # the body was replayed
        assert router.metric("omni_router_retries_total", worker="w0") == 1
        assert router.workers()["w0"]["in_rotation"] is False

        w2.kill()  # w1 has served one request, so w2 is the next first choice: for a WebSocket too
        ws, worker = await open_ws(router)
        assert worker == "w1"
        assert router.metric("omni_router_retries_total", worker="w2") == 1
        await ws.close()

        w1.kill()  # nobody left: a clear 503, quickly
        started = time.monotonic()
        failed = await client.get("/whoami")
        assert failed.status_code == 503
        assert failed.json()["error"]["code"] in {"worker_unreachable", "no_ready_worker"}
        assert time.monotonic() - started < 3


async def test_a_client_that_leaves_mid_stream_releases_the_worker(pair):
    router, upstreams = pair
    by_id = {u.worker_id: u for u in upstreams}
    async with httpx.AsyncClient(base_url=router.url, trust_env=False, timeout=10) as client:
        async with client.stream("GET", "/sse", params={"n": 200, "delay": 0.05}) as stream:
            worker = stream.headers["x-omni-worker"]
            lines = stream.aiter_lines()
            assert (await anext(lines)).startswith("data: ")
            assert (await client.get(f"{by_id[worker].url}/stats")).json()["streams"] == 1
        # The client hung up after one event: the router closes the worker's stream at once.
        wait_until(
            lambda: httpx.get(f"{by_id[worker].url}/stats", trust_env=False).json()["streams"] == 0,
            timeout=3,
            what="the worker's stream to close",
            log=router.log,
        )
    wait_until(lambda: router.workers()[worker]["sessions"] == 0, timeout=3, what="session released")


async def test_api_keys(cluster: Cluster, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# clients\nsk-test-1\nsk-test-2\n")
    (w0,) = cluster.upstreams("w0", wait=False)
    router = cluster.router(cluster.write_workers([w0.entry()]), "--api-keys-file", str(keys), wait=False)
    good = {"Authorization": "Bearer sk-test-2"}
    router.wait_rotation({"w0"}, timeout=40, headers=good)
    async with httpx.AsyncClient(base_url=router.url, trust_env=False, timeout=10) as client:
        missing = await client.get("/whoami")
        assert missing.status_code == 401
        assert missing.json() == {
            "error": {
                "message": "Missing or invalid API key: send `Authorization: Bearer <key>` with a key from the "
                "router's --api-keys-file.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
        }
        assert (await client.get("/whoami", headers={"Authorization": "Bearer sk-test"})).status_code == 401
        # The admin API takes no client keys: with no --admin-keys-file it answers on loopback only.
        assert (await client.get("/admin/workers")).status_code == 200
        assert (await client.get("/whoami", headers=good)).json()["worker"] == "w0"
        for open_path in ("/health", "/ready", "/metrics"):
            assert (await client.get(open_path)).status_code == 200
    with pytest.raises(InvalidStatus) as refused:
        await connect(f"{router.ws}/ws", proxy=None)
    assert refused.value.response.status_code == 401
    ws, worker = await open_ws(router, additional_headers=good)
    assert worker == "w0"
    await ws.close()


async def test_session_and_body_limits(cluster: Cluster):
    upstreams = cluster.upstreams("w0", "w1", wait=False)
    workers_file = cluster.write_workers([u.entry() for u in upstreams])
    router = cluster.router(
        workers_file, "--max-sessions-per-worker", "1", "--max-body-bytes", "1000", wait=False
    )
    router.wait_rotation({"w0", "w1"}, timeout=40)
    first, _ = await open_ws(router)
    second, _ = await open_ws(router)
    with pytest.raises(InvalidStatus) as refused:
        await connect(f"{router.ws}/ws", proxy=None)
    assert refused.value.response.status_code == 503
    assert json.loads(refused.value.response.body)["error"]["code"] == "all_workers_full"
    async with httpx.AsyncClient(base_url=router.url, trust_env=False, timeout=10) as client:
        full = await client.get("/whoami")
        assert (full.status_code, full.headers["retry-after"]) == (503, "1")
        assert full.json()["error"]["code"] == "all_workers_full"
        await first.close()
        wait_until(
            lambda: sum(w["sessions"] for w in router.workers().values()) == 1, timeout=3, what="one left"
        )
        assert (await client.post("/echo", content=b"x" * 1000)).json()["size"] == 1000
        too_big = await client.post("/echo", content=b"x" * 1001)
        assert too_big.status_code == 413
        assert too_big.json()["error"]["code"] == "request_too_large"

        async def chunked():
            for _ in range(4):
                yield b"y" * 300

        assert (await client.post("/echo", content=chunked())).status_code == 413
        # A worker that refuses an upgrade is answered as it answered.
        await second.close()
    with pytest.raises(InvalidStatus) as refused_by_worker:
        await connect(f"{router.ws}/refuse", proxy=None)
    assert refused_by_worker.value.response.status_code == 403


def test_a_worker_ready_since_the_last_health_round_is_used_at_once(cluster: Cluster):
    """With a health round only every 60 s, a request that finds no worker in rotation asks for a
    fresh round before refusing: a worker that turned ready meanwhile takes it (a router replica
    beside a starting worker), and one that is still not ready gets a prompt 503, not a wait."""
    (upstream,) = cluster.upstreams("w0")
    httpx.post(f"{upstream.url}/control/ready", params={"value": "0"}, trust_env=False).raise_for_status()
    router = cluster.router(cluster.write_workers([upstream.entry()]), "--health-interval", "60")
    assert not router.workers()["w0"]["in_rotation"]  # the startup round saw it starting

    started = time.monotonic()
    refused = httpx.get(f"{router.url}/v1/whoami", trust_env=False, timeout=10)
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "no_ready_worker"
    assert time.monotonic() - started < 3
    assert httpx.get(f"{router.url}/ready", trust_env=False, timeout=10).status_code == 503

    httpx.post(f"{upstream.url}/control/ready", params={"value": "1"}, trust_env=False).raise_for_status()
    time.sleep(2 * RECHECK_FRESH_S)  # the /ready above ran a round; one that recent counts as news
    served = httpx.get(f"{router.url}/v1/whoami", trust_env=False, timeout=10)
    assert served.status_code == 200, served.text
    assert served.json()["worker"] == "w0"
    assert httpx.get(f"{router.url}/ready", trust_env=False, timeout=10).status_code == 200
