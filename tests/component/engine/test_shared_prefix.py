"""Shared prompt prefixes on the real engine (OMNI_SHARED_PREFIX, tiny checkpoints, CPU): the first
request with a system prompt leaves its prompt's KV; later requests that start the same way reuse
it and prefill only the rest, with exactly the greedy tokens (and, for speech, the audio) of an
engine that prefills every prompt in full."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from engine_harness import Harness, finished, tiny_options, token_ids

from omni_runtime.contract.engine import AudioChunk, ChatTurn, GenerationRequest, SamplingParams

SYSTEM = "You answer every question in one calm sentence, and you never use lists or headings."
_ids = itertools.count()


def ask(question: str, *, want_audio: bool = False) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"sp{next(_ids)}",
        turns=(ChatTurn(role="system", text=SYSTEM), ChatTurn(role="user", text=question)),
        sampling=SamplingParams(max_tokens=8, temperature=0.0, seed=3, ignore_eos=True),
        want_audio=want_audio,
        stage_params={"talker": {"max_tokens": 30}},
    )


def _shared_engine(checkpoint: Path, **overrides: Any) -> Iterator[Harness]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMNI_SHARED_PREFIX", "1")
        harness = Harness(tiny_options(checkpoint, **overrides))
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture(scope="module")
def shared(tiny_checkpoint: Path) -> Iterator[Harness]:
    yield from _shared_engine(tiny_checkpoint)


def settle(harness: Harness) -> tuple[int, int]:
    """(admissions that used a shared prefix, their tokens) once every row ended and was kept, as
    the engine's stats (``/metrics``) report them; shared entries are not counted as sessions."""

    async def wait() -> tuple[int, int]:
        while not harness.engine.stages.local.quiet:
            await asyncio.sleep(0.01)
        stats = harness.engine.stats()
        assert stats.session_kv_shared_entries >= 1 and stats.session_kv_entries == 0
        return stats.session_kv_shared_hits, stats.session_kv_shared_tokens

    return harness.run(wait())


def audio(events: list[Any]) -> np.ndarray:
    return np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)])


def test_a_request_after_the_first_reuses_its_system_prompt(shared: Harness, speech_engine: Harness) -> None:
    assert speech_engine.engine.stages.local.thinker.shared_prefixes is False  # the baseline: no sharing
    shared.collect(ask("What is the sea?"))  # leaves its prompt's KV
    hits, tokens = settle(shared)
    reused = shared.collect(ask("Why is the sky blue?"))
    after_hits, after_tokens = settle(shared)
    full = speech_engine.collect(ask("Why is the sky blue?"))
    assert token_ids(reused) == token_ids(full) and token_ids(reused)
    assert after_hits - hits == 1
    prompt = finished(reused).usage.prompt_tokens
    assert 16 <= after_tokens - tokens == finished(reused).usage.cached_tokens < prompt
    assert finished(full).usage.cached_tokens == 0


def test_a_speech_reply_after_a_shared_prefix_speaks_the_same(
    shared: Harness, speech_engine: Harness
) -> None:
    """The talker's vectors of the shared part come from the kept entry (a speech request left it)."""
    shared.collect(ask("Say hello.", want_audio=True))
    hits, _ = settle(shared)
    reused = shared.collect(ask("Say goodbye.", want_audio=True))
    assert settle(shared)[0] - hits == 1
    full = speech_engine.collect(ask("Say goodbye.", want_audio=True))
    assert token_ids(reused) == token_ids(full)
    a, b = audio(reused), audio(full)
    assert a.size == b.size > 0
    np.testing.assert_allclose(a, b, atol=1e-3)


def test_a_burst_reuses_one_entry_in_one_batch(shared: Harness, speech_engine: Harness) -> None:
    shared.collect(ask("Seed the prefix."))
    hits, _ = settle(shared)
    entries = shared.engine.stages.local.thinker.kv.counters().entries
    questions = [f"Question number {i}, what now?" for i in range(4)]

    async def burst() -> list[list[Any]]:
        async def one(q: str) -> list[Any]:
            return [e async for e in shared.engine.generate(ask(q))]

        return await asyncio.gather(*(one(q) for q in questions))

    together = shared.run(burst())
    assert settle(shared)[0] - hits == 4
    assert shared.engine.stages.local.thinker.kv.counters().entries == entries  # none kept again
    for q, events in zip(questions, together, strict=True):
        assert token_ids(events) == token_ids(speech_engine.collect(ask(q))), q


def test_qwen3_reuses_a_shared_prefix_exactly() -> None:
    from omni_runtime.models.qwen3_omni_moe.tiny import ensure_tiny_checkpoint

    checkpoint = ensure_tiny_checkpoint(progress=False)
    engines = _shared_engine(checkpoint, pipeline="text")
    shared = next(engines)
    plain = Harness(tiny_options(checkpoint, pipeline="text"))
    try:
        shared.collect(ask("What is the sea?"))
        hits, _ = settle(shared)
        reused = shared.collect(ask("Why is the sky blue?"))
        assert settle(shared)[0] - hits == 1
        assert token_ids(reused) == token_ids(plain.collect(ask("Why is the sky blue?")))
    finally:
        plain.close()
        engines.close()
