"""The bench's echo upstream with a concurrency limit answers first come first served, K at a time:
the shape of a saturated worker, used to check that the router keeps a queue's order."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_limited_echo_serves_k_at_a_time_in_arrival_order() -> None:
    port = _free_port()
    argv = [sys.executable, "-m", "omni_runtime.bench.router.echo", "--port", str(port)]
    proc = subprocess.Popen([*argv, "--delay-ms", "150", "--concurrency", "2"])
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                httpx.get(f"{url}/ready", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                time.sleep(0.1)

        async def fire() -> list[tuple[int, float]]:
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                start = time.perf_counter()

                async def one(i: int) -> tuple[int, float]:
                    await asyncio.sleep(0.02 * i)  # arrival order 0, 1, 2, 3
                    (await client.post("/v1/chat/completions", json={})).raise_for_status()
                    return i, time.perf_counter() - start

                return await asyncio.gather(*(one(i) for i in range(4)))

        done = dict(asyncio.run(fire()))
        # Two at a time: requests 0 and 1 finish after one delay, 2 and 3 after two.
        assert max(done[0], done[1]) < min(done[2], done[3])
        assert min(done[2], done[3]) >= 0.3
    finally:
        proc.terminate()
        proc.wait(10)
