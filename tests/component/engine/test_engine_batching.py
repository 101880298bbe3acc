"""Continuous batching: concurrent requests share decode steps, cancels free slots, and batching
does not change greedy results."""

from __future__ import annotations

import asyncio
import contextlib

from engine_harness import Harness, finished, request, token_ids

from omni_runtime.contract.engine import Finished, TextDelta


def test_concurrent_requests_run_in_one_batch(speech_engine: Harness) -> None:
    async def many() -> list[list]:
        async def one(i: int) -> list:
            return [e async for e in speech_engine.engine.generate(request(f"Question {i}?", max_tokens=24))]

        return await asyncio.gather(*(one(i) for i in range(5)))

    results = speech_engine.run(many())
    assert all(finished(events).reason == "length" for events in results)
    assert speech_engine.engine.stats().max_running_batch > 1


def test_batched_greedy_output_equals_single_request_output(speech_engine: Harness) -> None:
    prompt = "Tell me a short story."
    alone = token_ids(speech_engine.collect(request(prompt, max_tokens=20)))

    async def together() -> list[list]:
        async def one(text: str, tokens: int) -> list:
            return [e async for e in speech_engine.engine.generate(request(text, max_tokens=tokens))]

        others = [
            one(f"Another prompt number {i}, a bit longer than the first." * (i + 1), 30) for i in range(3)
        ]
        return await asyncio.gather(one(prompt, 20), *others)

    batched = token_ids(speech_engine.run(together())[0])
    assert batched == alone


def test_closing_a_stream_frees_its_slot_while_another_continues(speech_engine: Harness) -> None:
    engine = speech_engine.engine

    async def scenario() -> tuple[int, int, int, Finished]:
        keep = engine.generate(request("Keep going.", max_tokens=400))
        drop = engine.generate(request("Stop soon.", max_tokens=400))
        await keep.__anext__()
        await drop.__anext__()
        both = engine.stats().running_batch
        await drop.aclose()  # the client went away
        for _ in range(3):  # a step boundary or two later the slot is gone
            await keep.__anext__()
        after_cancel = engine.stats().running_batch
        active = engine.stats().active_requests
        last = None
        async for event in keep:
            last = event
        assert isinstance(last, Finished)
        return both, after_cancel, active, last

    both, after_cancel, active, last = speech_engine.run(scenario())
    assert both == 2
    assert after_cancel == 1
    assert active == 1
    assert last.reason == "length"
    assert engine.stats().running_batch == 0
    assert engine.stats().active_requests == 0


def test_cancelling_a_speech_request_stops_its_talker(speech_engine: Harness) -> None:
    engine = speech_engine.engine

    async def scenario() -> int:
        stream = engine.generate(request(max_tokens=200, want_audio=True, talker_tokens=200))
        async with contextlib.aclosing(stream):
            async for event in stream:
                if isinstance(event, TextDelta):
                    break
        for _ in range(50):
            if engine.stages.talker.active == 0 and engine.stats().running_batch == 0:
                break
            await asyncio.sleep(0.02)
        return engine.stages.talker.active

    assert speech_engine.run(scenario()) == 0
    assert engine.stats().active_requests == 0


def test_concurrent_speech_requests_share_the_talker_and_leave_it_in_any_order(
    speech_engine: Harness,
) -> None:
    """Talker rows finish at different times, so the batch is compacted while others still speak."""

    async def many() -> list[list]:
        async def one(tokens: int, codes: int) -> list:
            req = request(f"Speak {tokens}.", max_tokens=tokens, want_audio=True, talker_tokens=codes)
            return [e async for e in speech_engine.engine.generate(req)]

        return await asyncio.gather(one(6, 20), one(30, 70), one(12, 35), one(40, 90))

    results = speech_engine.run(many())
    for events, codes in zip(results, (20, 70, 35, 90), strict=True):
        done = finished(events)
        assert done.reason == "length"
        samples = sum(len(e.pcm) for e in events if hasattr(e, "pcm"))
        assert 0 < samples <= codes * 480 and samples % 480 == 0
    assert speech_engine.engine.stages.talker.max_running_batch > 1
