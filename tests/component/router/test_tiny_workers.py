"""Two real `omni serve` workers (tiny checkpoint, CPU) behind a real `omni router` process.

The workers start once for the module (loading and warming up takes tens of seconds on a shared
CPU). A test that kills a worker leaves it dead; the `pair` fixture restarts any dead worker on its
old port before the next test, so the tests do not depend on their order.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from conftest import Cluster, Router, Upstream, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

READY_S = 400.0  # two workers loading at once on a shared 2-core machine
MESSAGES = [{"role": "user", "content": "Say something."}]


class TinyPair:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.workers = {worker_id: cluster.tiny_worker(worker_id) for worker_id in ("tiny-w0", "tiny-w1")}
        entries = [worker.entry() for worker in self.workers.values()]
        self.router = cluster.router(cluster.write_workers(entries), "--health-interval", "0.5", wait=False)

    def ensure_running(self) -> Router:
        """Both workers alive, undrained and in rotation: what every test starts from."""
        for worker_id, worker in list(self.workers.items()):
            if worker.popen.poll() is not None:
                self.workers[worker_id] = self.cluster.tiny_worker(worker_id, port=worker.port)
        wait_until(
            lambda: _get_ok(f"{self.router.url}/health"), timeout=60, what="router", log=self.router.log
        )
        for worker_id in self.workers:
            httpx.post(f"{self.router.url}/admin/workers/{worker_id}/undrain", trust_env=False)
        self.router.wait_rotation(set(self.workers), timeout=READY_S)
        return self.router


def _get_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyPair]:
    from omni_runtime.models.qwen2_5_omni.tiny import ensure_tiny_checkpoint

    ensure_tiny_checkpoint(progress=False)  # made once per machine, before two workers race for it
    cluster = Cluster(tmp=tmp_path_factory.mktemp("tiny-pair"))
    try:
        yield TinyPair(cluster)
    finally:
        cluster.stop_all()


@pytest.fixture
def pair(tiny_pair: TinyPair) -> tuple[Router, dict[str, Upstream]]:
    return tiny_pair.ensure_running(), tiny_pair.workers


def chat(max_tokens: int, *, stream: bool) -> dict:
    # ignore_eos: random weights may draw EOS at any step; these streams must run their full length.
    return {
        "model": "tiny",
        "messages": MESSAGES,
        "max_tokens": max_tokens,
        "stream": stream,
        "ignore_eos": True,
    }


async def sse_events(response: httpx.Response) -> AsyncIterator[tuple[float, str]]:
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            yield time.monotonic(), line[len("data: ") :]


async def test_sse_chat_completion_streams_through_the_router(pair):
    router, _ = pair
    async with (
        httpx.AsyncClient(base_url=router.url, trust_env=False, timeout=120) as client,
        client.stream("POST", "/v1/chat/completions", json=chat(48, stream=True)) as response,
    ):
        assert response.status_code == 200
        assert response.headers["x-omni-worker"] in {"tiny-w0", "tiny-w1"}
        started = time.monotonic()
        events = [(at - started, data) async for at, data in sse_events(response)]
    assert events[-1][1] == "[DONE]"
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 48
    assert chunks[0]["system_fingerprint"] == "r1"  # the worker's revision, untouched
    # Unbuffered: the first token is in hand well before the stream ends.
    total = events[-1][0]
    assert events[1][0] < 0.5 * total, [round(at, 3) for at, _ in events]


async def test_openai_client_through_the_router(pair):
    from openai import AsyncOpenAI

    router, _ = pair
    client = AsyncOpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
    stream = await client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, stream=True)
    pieces = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
    assert len(pieces) >= 2
    plain = await client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4)
    assert plain.usage.completion_tokens == 4
    await client.close()


async def test_a_live_stream_stays_put_while_new_sessions_spread_and_keys_stick(pair):
    router, _ = pair
    async with httpx.AsyncClient(base_url=router.url, trust_env=False, timeout=120) as client:
        async with client.stream("POST", "/v1/chat/completions", json=chat(200, stream=True)) as long_stream:
            home = long_stream.headers["x-omni-worker"]
            events = sse_events(long_stream)
            await anext(events)
            # The other worker is less loaded: new requests go there while the stream lives.
            other = {
                (await client.post("/v1/chat/completions", json=chat(2, stream=False))).headers[
                    "x-omni-worker"
                ]
                for _ in range(3)
            }
            assert other == {"tiny-w0", "tiny-w1"} - {home}
            rest = [data async for _, data in events]
            assert rest[-1] == "[DONE]"
        keyed = {
            (
                await client.post(
                    "/v1/chat/completions",
                    json=chat(2, stream=False),
                    headers={"X-Session-Id": "conversation-42"},
                )
            ).headers["x-omni-worker"]
            for _ in range(4)
        }
        assert len(keyed) == 1


async def test_drain_lets_the_live_stream_finish_and_sends_new_work_elsewhere(pair):
    router, _ = pair
    async with httpx.AsyncClient(base_url=router.url, trust_env=False, timeout=120) as client:
        async with client.stream("POST", "/v1/chat/completions", json=chat(200, stream=True)) as live:
            home = live.headers["x-omni-worker"]
            events = sse_events(live)
            await anext(events)
            drained = (await client.post(f"/admin/workers/{home}/drain")).json()
            assert (drained["state"], drained["idle"]) == ("draining", False)
            for _ in range(3):
                answer = await client.post("/v1/chat/completions", json=chat(2, stream=False))
                assert answer.headers["x-omni-worker"] != home
            rest = [json.loads(data) async for _, data in events if data != "[DONE]"]
            assert rest[-1]["choices"][0]["finish_reason"] == "length"  # the stream ran to its end
        idle = (await client.get(f"/admin/workers/{home}", params={"wait": 30})).json()
        assert (idle["state"], idle["idle"]) == ("draining", True)


async def test_killing_a_worker_mid_stream_ends_that_stream_cleanly(pair):
    router, workers = pair
    async with httpx.AsyncClient(base_url=router.url, trust_env=False, timeout=120) as client:
        async with client.stream("POST", "/v1/chat/completions", json=chat(2000, stream=True)) as doomed:
            victim = doomed.headers["x-omni-worker"]
            events = sse_events(doomed)
            await anext(events)
            workers[victim].kill()
            killed_at = time.monotonic()
            rest = [data async for _, data in events]
        assert time.monotonic() - killed_at < 10
        error = json.loads(rest[-1])["error"]
        assert (error["code"], victim in error["message"]) == ("worker_failed", True)
        wait_until(
            lambda: not router.workers()[victim]["in_rotation"], timeout=10, what="victim out of rotation"
        )
        survivor = ({"tiny-w0", "tiny-w1"} - {victim}).pop()
        for _ in range(3):
            answer = await client.post("/v1/chat/completions", json=chat(2, stream=False))
            assert (answer.status_code, answer.headers["x-omni-worker"]) == (200, survivor)
