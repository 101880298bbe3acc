"""Sessions through a real router process: binding, streaming, draining, table changes."""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from conftest import Cluster, wait_until

pytestmark = pytest.mark.timeout(120)


async def open_ws(router, path: str = "/ws", **kwargs):
    ws = await connect(f"{router.ws}{path}", proxy=None, **kwargs)
    hello = json.loads(await ws.recv())
    return ws, hello["worker"]


async def test_a_websocket_stays_on_one_worker_while_new_sessions_spread(pair):
    router, _ = pair
    first, home = await open_ws(router, subprotocols=["omni.v1"])
    assert first.subprotocol == "omni.v1"  # the worker's subprotocol choice reaches the client
    others = []
    for _ in range(4):
        others.append(await open_ws(router))
        await first.send("still here")
        assert await first.recv() == f"{home}:still here"
        await first.send(b"\x00\x01\xff")
        assert await first.recv() == b"\xff\x01\x00"  # binary frames stay binary
    # Each new session went to the least-loaded worker (equal loads: fewest assigned, then id).
    assert home == "w0"
    assert [worker for _, worker in others] == ["w1", "w0", "w1", "w0"]
    assert {w["id"]: w["sessions"] for w in router.workers().values()} == {"w0": 3, "w1": 2}
    async with httpx.AsyncClient(base_url=router.url, trust_env=False) as client:
        workers = [(await client.get("/whoami")).json()["worker"] for _ in range(4)]
    assert workers == ["w1"] * 4  # plain requests also go to the less-loaded worker
    # A close code and reason from the worker reach the client unchanged.
    await first.send("close:4001:session over")
    with pytest.raises(ConnectionClosed) as closed:
        await first.recv()
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4001, "session over")
    for ws, _ in others:
        await ws.close(4000, "client done")
    wait_until(
        lambda: all(w["sessions"] == 0 for w in router.workers().values()), timeout=5, what="sessions closed"
    )
    assert router.metric("omni_router_requests_total", worker=home, status="101") >= 3
    # `omni router` froze its startup heap out of full garbage collections.
    assert router.metric("omni_router_gc_frozen_objects") > 1000


async def test_sse_chunks_arrive_before_the_stream_ends(pair):
    router, _ = pair
    arrivals: list[float] = []
    async with (
        httpx.AsyncClient(base_url=router.url, trust_env=False) as client,
        client.stream("GET", "/sse", params={"n": 5, "delay": 0.4}) as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        started = time.monotonic()
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic() - started)
    assert len(arrivals) == 6  # five events and [DONE]
    # Unbuffered: the first event is in hand long before the last one is produced (5 x 0.4 s).
    assert arrivals[0] < 0.3
    assert arrivals[-1] - arrivals[0] > 1.5
    assert all(later - earlier > 0.2 for earlier, later in itertools.pairwise(arrivals))


async def test_session_ids_route_alike_through_two_router_processes(cluster: Cluster):
    upstreams = cluster.upstreams("w0", "w1", "w2")
    workers_file = cluster.write_workers([u.entry() for u in upstreams])
    first = cluster.router(workers_file, name="router-a")
    second = cluster.router(workers_file, name="router-b")
    for router in (first, second):
        router.wait_rotation({"w0", "w1", "w2"})
    async with httpx.AsyncClient(trust_env=False) as client:
        for _ in range(3):
            created = (await client.post(f"{first.url}/v1/streaming_input/sessions")).json()
            session, owner = created["session_id"], created["worker"]
            for router in (second, first, second):
                chunk = await client.post(f"{router.url}/v1/streaming_input/sessions/{session}/chunks")
                assert chunk.json() == {"worker": owner, "session_id": session}
                assert chunk.headers["x-omni-worker"] == owner
            via_query = await client.get(f"{second.url}/v1/whoami", params={"session_id": session})
            assert via_query.json()["worker"] == owner
        # A plain session key sticks to the same worker through either router.
        for key in ("alice", "bob", "carol"):
            seen = {
                (await client.get(f"{router.url}/whoami", headers={"X-Session-Id": key})).json()["worker"]
                for router in (first, second, first)
            }
            assert len(seen) == 1


async def test_drain_lets_the_live_session_finish_and_sends_new_ones_elsewhere(pair):
    router, _ = pair
    live, home = await open_ws(router)
    other = "w1" if home == "w0" else "w0"
    async with httpx.AsyncClient(base_url=router.url, trust_env=False) as client:
        drained = (await client.post(f"/admin/workers/{home}/drain")).json()
        assert (drained["state"], drained["sessions"], drained["idle"], drained["in_rotation"]) == (
            "draining",
            1,
            False,
            False,
        )
        # New sessions, of every kind, go elsewhere.
        assert {(await open_ws(router))[1] for _ in range(3)} == {other}
        assert {(await client.get("/whoami")).json()["worker"] for _ in range(5)} == {other}
        # The live session carries on, and the drain is not idle while it does.
        await live.send("after drain")
        assert await live.recv() == f"{home}:after drain"
        assert (await client.get(f"/admin/workers/{home}")).json()["idle"] is False
        waiting = asyncio.ensure_future(client.get(f"/admin/workers/{home}", params={"wait": 10}))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # ?wait holds the answer until the worker is idle
        await live.close()
        idle = (await waiting).json()
        assert (idle["idle"], idle["sessions"], idle["state"]) == (True, 0, "draining")
        back = (await client.post(f"/admin/workers/{home}/undrain")).json()
        assert back["state"] == "ready"
        assert (await client.post("/admin/workers/nope/drain")).status_code == 404


async def test_worker_file_changes_apply_without_a_restart(cluster: Cluster):
    w0, w1, w2 = cluster.upstreams("w0", "w1", "w2")
    workers_file = cluster.write_workers([w0.entry()])
    router = cluster.router(workers_file)
    router.wait_rotation({"w0"})
    cluster.write_workers([w0.entry(), w1.entry(), w2.entry()])
    router.wait_rotation({"w0", "w1", "w2"})
    live, home = await open_ws(router, additional_headers={"X-Session-Id": "pinned-key"})
    # The file marks the session's worker draining: no new sessions there, the live one continues.
    cluster.write_workers([u.entry("draining" if u.worker_id == home else "ready") for u in (w0, w1, w2)])
    router.wait_rotation({"w0", "w1", "w2"} - {home})
    await live.send("hello")
    assert await live.recv() == f"{home}:hello"
    # Now the worker is removed from the file: its live session is closed with 1012 and a reason.
    cluster.write_workers([u.entry() for u in (w0, w1, w2) if u.worker_id != home])
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(live.recv(), timeout=5)
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1012, f"worker {home} is gone")
    wait_until(lambda: home not in router.workers(), timeout=5, what=f"{home} left the table", log=router.log)


async def test_router_ready_follows_its_workers(cluster: Cluster):
    (w0,) = cluster.upstreams("w0")
    workers_file = cluster.write_workers([])
    router = cluster.router(workers_file)
    async with httpx.AsyncClient(base_url=router.url, trust_env=False) as client:
        not_ready = await client.get("/ready")
        assert not_ready.status_code == 503
        assert not_ready.json()["error"]["code"] == "no_ready_worker"
        request = await client.get("/whoami")
        assert request.status_code == 503
        assert request.json()["error"]["message"] == (
            "No worker is ready to take a new session (the worker table is empty); retry shortly."
        )
        cluster.write_workers([w0.entry()])
        router.wait_rotation({"w0"})
        assert (await client.get("/ready")).json() == {"status": "ready", "workers_in_rotation": ["w0"]}
        # The worker's own /ready fails: it leaves rotation, and comes back when ready again.
        await client.post(f"{w0.url}/control/ready", params={"value": "0"})
        router.wait_rotation(set())
        await client.post(f"{w0.url}/control/ready", params={"value": "1"})
        router.wait_rotation({"w0"})


async def _read_until(reader: asyncio.StreamReader, marker: bytes, buffer: bytearray) -> bytes:
    """Read a chunked HTTP body until `marker` shows up in what has been decoded so far."""
    while marker not in buffer:
        size = int((await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout=5)).split(b";")[0], 16)
        buffer += await reader.readexactly(size + 2)
        del buffer[-2:]
    return bytes(buffer)


async def test_a_chunked_upload_and_its_answer_stream_both_ways_at_once(pair):
    # Streaming input in one POST: each uploaded piece is answered before the next is sent, which
    # works only if the router relays the upload and the answer at the same time.
    router, _ = pair
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
    writer.write(b"POST /duplex HTTP/1.1\r\nhost: router\r\ntransfer-encoding: chunked\r\n\r\n")
    writer.write(b"3\r\none\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    assert head.startswith(b"HTTP/1.1 200")
    received = bytearray()
    assert b'"got": "one"' in await _read_until(reader, b'"got": "one"', received)
    writer.write(b"3\r\ntwo\r\n")
    assert b'"got": "two"' in await _read_until(reader, b'"got": "two"', received)
    writer.write(b"0\r\n\r\n")
    await _read_until(reader, b"[DONE]", received)
    writer.close()
