"""Concurrency reaches the engine as one batch, and a client that leaves frees its slot."""

from __future__ import annotations

import asyncio
import re
import time

import httpx

from conftest import Worker


def _gauge(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def _metrics(worker: Worker) -> str:
    with worker.client() as client:
        return client.get("/metrics").text


async def test_concurrent_requests_are_batched(worker: Worker) -> None:
    body = {"messages": [{"role": "user", "content": "Count slowly."}], "max_tokens": 24, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=worker.url, timeout=120) as client:
        replies = await asyncio.gather(*(client.post("/v1/chat/completions", json=body) for _ in range(6)))
    assert [r.status_code for r in replies] == [200] * 6
    assert all(r.json()["usage"]["completion_tokens"] == 24 for r in replies)
    text = _metrics(worker)
    assert _gauge(text, "omni_max_running_batch_size") > 1
    assert worker.engine.stats().max_running_batch > 1
    # The thinker's load: it was busy, and its mean batch (rows stepped per step) exceeds one.
    busy = _gauge(text, 'omni_stage_busy_seconds_total{stage="thinker"}')
    steps = _gauge(text, 'omni_stage_calls_total{stage="thinker"}')
    rows = _gauge(text, 'omni_stage_items_total{stage="thinker"}')
    assert busy > 0 and steps > 0 and rows / steps > 1


def _wait_idle(worker: Worker, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        text = _metrics(worker)
        if _gauge(text, "omni_engine_active_requests") == 0 and _gauge(text, "omni_active_sessions") == 0:
            return text
        assert time.monotonic() < deadline, f"the slot was not freed:\n{text}"
        time.sleep(0.05)


def test_closing_a_stream_cancels_its_generation(worker: Worker) -> None:
    _wait_idle(worker)
    body = {
        "messages": [{"role": "user", "content": "Go on forever."}],
        "max_tokens": 200,
        "ignore_eos": True,
    }
    began = time.monotonic()
    with (
        worker.client() as client,
        client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r,
    ):
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content":"' in line:
                seen += 1
            if seen == 3:
                assert _gauge(_metrics(worker), "omni_engine_active_requests") == 1
                break  # abandoning the iterator closes the connection mid-stream
    _wait_idle(worker)
    assert time.monotonic() - began < 20  # long before 200 tokens would have finished


async def test_abandoning_a_non_streaming_request_cancels_it(worker: Worker) -> None:
    _wait_idle(worker)
    body = {
        "messages": [{"role": "user", "content": "Go on forever."}],
        "max_tokens": 200,
        "ignore_eos": True,
    }
    async with httpx.AsyncClient(base_url=worker.url, timeout=120) as client:
        task = asyncio.ensure_future(client.post("/v1/chat/completions", json=body))
        deadline = time.monotonic() + 20
        while _gauge(_metrics(worker), "omni_engine_active_requests") < 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        task.cancel()  # closes the connection
        await asyncio.gather(task, return_exceptions=True)
    _wait_idle(worker)
