"""The router's HTTP/1.1 client against a real upstream process: reuse, streaming, HEAD, failures."""

from __future__ import annotations

import json
import time

import pytest

from conftest import Cluster, free_port
from omni_runtime.router.upstream_client import ConnectFailed, UpstreamPool, UpstreamTimeout

pytestmark = pytest.mark.timeout(60)


async def call(pool: UpstreamPool, base_url: str, method: str, target: str, body=b"", headers=None):
    response = await pool.request(
        base_url=base_url, method=method, target=target, headers=headers or [], body=body
    )
    try:
        return response.status, dict(response.headers), await response.read(), response
    finally:
        response.close()


async def test_keep_alive_reuse_streaming_head_and_bodies(cluster: Cluster):
    (worker,) = cluster.upstreams("w0")
    pool = UpstreamPool(connect_timeout=2, read_timeout=5)
    try:
        connections = set()
        for index in range(20):
            status, _, data, response = await call(pool, worker.url, "GET", f"/whoami?n={index}")
            assert (status, json.loads(data)["query"]) == (200, f"n={index}")
            connections.add(id(response._connection))
        assert len(connections) == 1  # one keep-alive connection served them all

        # A chunked SSE answer arrives chunk by chunk, then the connection is reused.
        response = await pool.request(
            base_url=worker.url, method="GET", target="/sse?n=3&delay=0.3", headers=[], body=b""
        )
        assert response.header(b"transfer-encoding") == b"chunked"
        arrivals, chunks = [], []
        started = time.monotonic()
        async for chunk in response.iter_chunks():
            arrivals.append(time.monotonic() - started)
            chunks.append(chunk)
        response.close()
        assert b"".join(chunks).count(b"data: ") == 4
        assert arrivals[0] < 0.25 and arrivals[-1] > 0.8
        assert id(response._connection) in connections

        # HEAD: headers announce a body that never comes; no hang, and the pool still works.
        status, headers, data, _ = await call(pool, worker.url, "HEAD", "/whoami")
        assert (status, data) == (200, b"")
        assert int(headers[b"content-length"]) > 0
        assert (await call(pool, worker.url, "GET", "/whoami"))[0] == 200

        # A request body given as a stream goes out chunked and arrives whole.
        async def parts():
            for _ in range(5):
                yield b"x" * 1000

        status, _, data, _ = await call(pool, worker.url, "POST", "/echo", body=parts())
        assert (status, json.loads(data)["size"]) == (200, 5000)
    finally:
        pool.close()


async def test_dead_idle_connections_are_skipped_and_failures_are_typed(cluster: Cluster):
    (worker,) = cluster.upstreams("w0")
    pool = UpstreamPool(connect_timeout=2, read_timeout=1)
    try:
        first = (await call(pool, worker.url, "GET", "/whoami"))[3]
        worker.kill()
        with pytest.raises(ConnectFailed) as refused:
            await call(pool, worker.url, "GET", "/whoami")
        assert refused.value.started is False  # safe to retry elsewhere

        # The worker comes back on the same port: the old idle connection is not used again.
        (again,) = cluster.upstreams("w0", port=worker.port)
        status, _, _, response = await call(pool, again.url, "GET", "/whoami")
        assert status == 200
        assert response._connection is not first._connection

        # A worker silent for longer than the read timeout.
        response = await pool.request(
            base_url=again.url, method="GET", target="/sse?n=2&delay=3", headers=[], body=b""
        )
        with pytest.raises(UpstreamTimeout):
            await response.read()
        response.close()
    finally:
        pool.close()

    with pytest.raises(ConnectFailed):
        await UpstreamPool(connect_timeout=1, read_timeout=1).request(
            base_url=f"http://127.0.0.1:{free_port()}", method="GET", target="/", headers=[], body=b""
        )
