"""The thinker queuing each decode step before the previous step's tokens are read
(``OMNI_THINKER_AHEAD=on``; on by default only on a GPU, where it takes the host's work between
steps off the GPU's path): the same greedy tokens as one step at a time while rows end at
different steps, a cancel that frees its slot while another row goes on, and a session's next
turn on the KV its previous turn left (which then holds one more fed token: the reply's last)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_harness import Harness, finished, request, tiny_options, token_ids
from test_engine_conversation_kv import converse

from omni_runtime.contract.engine import Finished


@pytest.fixture(scope="module")
def ahead_engine(tiny_checkpoint: Path) -> Iterator[Harness]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMNI_THINKER_AHEAD", "on")  # read when the engine starts
        harness = Harness(tiny_options(tiny_checkpoint))
    yield harness
    harness.close()


def _together(harness: Harness, budgets: list[int]) -> list[list]:
    async def many() -> list[list]:
        async def one(i: int, tokens: int) -> list:
            text = f"Prompt {i}: " + "tell me more " * (i + 1)
            return [e async for e in harness.engine.generate(request(text, max_tokens=tokens))]

        return await asyncio.gather(*(one(i, tokens) for i, tokens in enumerate(budgets)))

    return harness.run(many())


def test_rows_ending_at_different_steps_get_the_tokens_of_one_step_at_a_time(
    speech_engine: Harness, ahead_engine: Harness
) -> None:
    thinker = ahead_engine.engine.stages.local.thinker
    assert thinker.ahead and not speech_engine.engine.stages.local.thinker.ahead  # auto: off on a CPU
    before = ahead_engine.engine.stats()  # /metrics: omni_thinker_steps_total, omni_thinker_steps_ahead_total
    alone_before = speech_engine.engine.stats()
    budgets = [3, 9, 17, 30]
    ahead = _together(ahead_engine, budgets)
    alone = _together(speech_engine, budgets)
    for events_ahead, events_alone, tokens in zip(ahead, alone, budgets, strict=True):
        assert token_ids(events_ahead) == token_ids(events_alone)
        assert len(token_ids(events_ahead)) == tokens
        assert finished(events_ahead).reason == "length"
    after, alone_after = ahead_engine.engine.stats(), speech_engine.engine.stats()
    # The steps did run ahead: all but a batch's first and the one or two after each change (an
    # admission, a row ending); 23 of 30 here, the rest of the bound for admissions that split.
    ahead_steps = after.thinker_steps_ahead - before.thinker_steps_ahead
    steps = after.thinker_steps - before.thinker_steps
    assert steps // 3 < ahead_steps < steps
    assert alone_after.thinker_steps_ahead == alone_before.thinker_steps_ahead == 0
    assert after.running_batch == 0


def test_a_cancel_frees_its_slot_while_another_row_goes_on(ahead_engine: Harness) -> None:
    engine = ahead_engine.engine

    async def scenario() -> tuple[int, int, Finished]:
        keep = engine.generate(request("Keep going.", max_tokens=60))
        drop = engine.generate(request("Stop soon.", max_tokens=60))
        for _ in range(3):
            await keep.__anext__()
            await drop.__anext__()
        both = engine.stats().running_batch
        await drop.aclose()  # the client went away, with a step queued behind the one in flight
        for _ in range(4):
            await keep.__anext__()
        after = engine.stats().running_batch
        last = None
        async for event in keep:
            last = event
        assert isinstance(last, Finished)
        return both, after, last

    both, after, last = ahead_engine.run(scenario())
    assert (both, after, last.reason) == (2, 1, "length")
    assert engine.stats().active_requests == 0


def test_a_sessions_next_turn_reuses_the_kv_left_by_steps_run_ahead(ahead_engine: Harness) -> None:
    converse(ahead_engine, "ahead-a", [(), (), ()])
