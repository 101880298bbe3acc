"""A realtime ``response.cancel`` mid-speech frees the engine: the talker row is finished by the
cancel, no vocoder window starts after it, the worker's /metrics say so, and the next response
of the same session completes (the official openai client, through the router).

Both families run the ``response.cancel`` test (Qwen3-Omni-MoE: the talker's frame rows and the
windowed Code2Wav); the cancel probe and the socket-close test run on Qwen2.5-Omni.
"""

from __future__ import annotations

import asyncio
import re
import threading

import httpx
from openai import AsyncOpenAI

QUIET_TIMEOUT_S = 60.0
_held: list[asyncio.Task[None]] = []


def _counter(text: str, name: str, stage: str) -> float:
    match = re.search(rf'^{name}\{{stage="{stage}"\}} (\S+)$', text, re.M)
    assert match, f"{name} for {stage} missing from /metrics"
    return float(match.group(1))


async def _metrics(live) -> str:
    async with httpx.AsyncClient() as client:
        return (await client.get(f"http://{live.worker_host}/metrics", timeout=10)).text


async def _quiet(engine) -> None:
    """Until no stage holds a row, a queued window or a call (read on the engine's own loop)."""
    local = engine.stages.local
    loop = asyncio.get_running_loop()
    deadline = loop.time() + QUIET_TIMEOUT_S
    while not local.quiet:
        assert loop.time() < deadline, "a stage kept working for the cancelled response"
        await asyncio.sleep(0.01)


async def _hold_the_talker_mid_speech(engine, release: threading.Event) -> int:
    """Once the reply speaks (a talker row and a vocoder window launched), hold the talker's
    thread, so the row cannot end by itself before the cancel; returns the talker rows then."""
    local = engine.stages.local
    windows = local.vocoder_worker.items
    loop = asyncio.get_running_loop()
    deadline = loop.time() + QUIET_TIMEOUT_S
    while not (local.talker.active and local.vocoder_worker.items > windows):
        assert loop.time() < deadline, "the response never started speaking"
        await asyncio.sleep(0.002)
    started = threading.Event()

    def hold() -> None:
        started.set()
        release.wait(QUIET_TIMEOUT_S)

    _held.append(loop.create_task(local.talker.thread.run(hold)))  # ends once released
    while not started.is_set():
        await asyncio.sleep(0.002)
    return int(local.talker.active)


async def _on_engine_loop(live, coro):
    """Run ``coro`` on the worker's loop (where the engine lives) without blocking this one."""
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, live.loop))


async def _speak_with_the_talker_held(live, conn, release: threading.Event) -> None:
    """Ask the session for a long spoken reply; return once it speaks and its talker is held."""
    assert (await conn.recv()).type == "session.created"
    await conn.session.update(
        session={"type": "realtime", "output_modalities": ["audio"], "max_output_tokens": 200}
    )
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Talk."}]}
    )
    holding = asyncio.ensure_future(_on_engine_loop(live, _hold_the_talker_mid_speech(live.engine, release)))
    await conn.response.create()
    assert await holding == 1, "the talker row was still speaking when the cancel came"


async def test_response_cancel_mid_speech_stops_the_talker_and_the_vocoder(family_live) -> None:
    live = family_live
    client = AsyncOpenAI(base_url=f"http://{live.router_host}/v1", api_key="unused")
    before = await _metrics(live)
    release = threading.Event()
    async with client.realtime.connect(model="tiny") as conn:
        try:
            await _speak_with_the_talker_held(live, conn, release)
            await conn.response.cancel()
            async for event in conn:
                if event.type == "response.done":
                    assert event.response.status == "cancelled"
                    break
            # response.done follows the engine's release of the request: no window may start now.
            at_cancel = await _metrics(live)
        finally:
            release.set()
        await _on_engine_loop(live, _quiet(live.engine))
        after = await _metrics(live)
        cancelled = "omni_stage_cancelled_total"
        assert _counter(after, cancelled, "talker") == _counter(before, cancelled, "talker") + 1
        items = "omni_stage_items_total"
        assert _counter(after, items, "vocoder") == _counter(at_cancel, items, "vocoder")

        # The session answers again, in full.
        await conn.response.create(response={"output_modalities": ["text"], "max_output_tokens": 4})
        async for event in conn:
            if event.type == "response.done":
                assert event.response.status in ("completed", "incomplete")
                break


async def test_the_cancel_probe_reports_the_work_left_after_a_cancel(live) -> None:
    from omni_runtime.bench.cancel_tail import cancel_once

    result = await cancel_once(
        f"ws://{live.worker_host}/v1/realtime", f"http://{live.worker_host}/metrics", after_deltas=1
    )
    assert result["status"] in ("cancelled", "ended_before_cancel")
    assert result["cancel_to_done_s"] >= 0
    assert result["cancel_to_quiet_s"] >= 0
    for stage, gained in result["stages"].items():
        # The rest of a call running at the cancel is part of what the stage did after it.
        assert 0 <= gained["busy_after_cancel_s"] <= gained["busy_s"] + 1e-6, stage
    if result["status"] == "cancelled":
        cancelled = {stage: g["cancelled"] for stage, g in result["stages"].items() if g["cancelled"]}
        assert cancelled, "a reply cancelled mid-speech finishes a row or drops a window"


async def _released(engine) -> int:
    """Once the talker holds no live row (the session's close reached the engine): the vocoder
    windows launched so far, read in the same loop step."""
    local = engine.stages.local
    loop = asyncio.get_running_loop()
    deadline = loop.time() + QUIET_TIMEOUT_S
    while local.talker.active:
        assert loop.time() < deadline, "closing the socket did not cancel the response"
        await asyncio.sleep(0.002)
    return int(local.vocoder_worker.items)


async def test_closing_the_socket_mid_speech_stops_the_talker_and_the_vocoder(live) -> None:
    client = AsyncOpenAI(base_url=f"http://{live.router_host}/v1", api_key="unused")
    before = await _metrics(live)
    release = threading.Event()
    try:
        async with client.realtime.connect(model="tiny") as conn:
            await _speak_with_the_talker_held(live, conn, release)
        # The socket is closed (through the router): the session cancels its response.
        windows = await _on_engine_loop(live, _released(live.engine))
    finally:
        release.set()
    await _on_engine_loop(live, _quiet(live.engine))
    after = await _metrics(live)
    cancelled = "omni_stage_cancelled_total"
    assert _counter(after, cancelled, "talker") == _counter(before, cancelled, "talker") + 1
    assert _counter(after, "omni_stage_items_total", "vocoder") == windows
