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
    # Each request's wait for a thinker step: a histogram, its +Inf bucket equal to its count.
    admitted = _gauge(text, 'omni_stage_wait_seconds_count{kind="admission",stage="thinker"}')
    assert admitted >= 6
    assert (
        _gauge(text, 'omni_stage_wait_seconds_bucket{kind="admission",le="+Inf",stage="thinker"}') == admitted
    )
    assert _gauge(text, 'omni_stage_wait_seconds_sum{kind="admission",stage="thinker"}') >= 0


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


def _stage_counter(text: str, name: str, stage: str) -> float:
    return _gauge(text, f'{name}{{stage="{stage}"}}')


def _stages_quiet(worker: Worker, timeout_s: float = 60.0) -> None:
    """Until no stage holds a row, a queued window or a running call (the engine's own state)."""
    local = worker.engine.stages.local  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout_s
    while not local.quiet:
        assert time.monotonic() < deadline, "a stage kept working for the cancelled request"
        time.sleep(0.01)


def test_closing_a_speech_stream_stops_its_talker_and_vocoder(worker: Worker) -> None:
    _wait_idle(worker)
    before = _metrics(worker)
    body = {
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": 200,
        "ignore_eos": True,
        "stream": True,
        "modalities": ["text", "audio"],
        "audio": {"format": "pcm16"},
        # Greedy: a sampled tiny talker sometimes draws its end code before the first window, and
        # a row that ended by itself is not one the cancel finished.
        "stage_params": {"talker": {"max_tokens": 3000, "temperature": 0.0}},
    }
    with worker.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if '"audio":{' in line and '"data":"' in line:
                break  # the first audio chunk: leave mid-speech
    _wait_idle(worker)  # the engine let go of the request
    at_cancel = _metrics(worker)
    _stages_quiet(worker)
    after = _metrics(worker)
    # The talker row was finished by the cancel; no vocoder window started after it.
    cancelled = "omni_stage_cancelled_total"
    assert _stage_counter(after, cancelled, "talker") == _stage_counter(before, cancelled, "talker") + 1
    items = "omni_stage_items_total"
    assert _stage_counter(after, items, "vocoder") == _stage_counter(at_cancel, items, "vocoder")
    # Whatever ran on after the cancel was the rest of calls already running: within their busy time.
    for stage in ("thinker", "talker", "vocoder"):
        late = _stage_counter(after, "omni_stage_busy_after_cancel_seconds_total", stage)
        assert 0 <= late <= _stage_counter(after, "omni_stage_busy_seconds_total", stage)
    # The next speech request is served.
    short = {**body, "stream": False, "max_tokens": 4, "stage_params": {"talker": {"max_tokens": 30}}}
    with worker.client() as client:
        reply = client.post("/v1/chat/completions", json=short)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["audio"]["data"]
