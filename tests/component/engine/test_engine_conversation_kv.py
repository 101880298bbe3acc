"""Conversation KV on the real engine (tiny checkpoint, CPU): a session's turn reuses the thinker KV
its previous turn left and prefills only the rest, with exactly the greedy tokens of a full
prefill; media is matched by content; a small budget evicts and the next turn rebuilds in full."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from engine_harness import Harness, finished, image, tiny_options, token_ids, tone

from omni_runtime.contract.engine import (
    AudioChunk,
    ChatTurn,
    EngineError,
    EngineStats,
    GenerationRequest,
    MediaInput,
    SamplingParams,
    TextDelta,
)

_ids = itertools.count()


def ask(turns: list[ChatTurn], *, session: str | None, want_audio: bool = False) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"kv{next(_ids)}",
        turns=tuple(turns),
        sampling=SamplingParams(max_tokens=10, temperature=0.0, seed=5),
        want_audio=want_audio,
        stage_params={"talker": {"max_tokens": 30}},
        session_key=session,
    )


def reply_text(events: list[Any]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def settled(harness: Harness) -> EngineStats:
    """The engine's counters once every row ended and its KV was kept."""

    async def wait() -> EngineStats:
        while not harness.engine.stages.local.quiet:
            await asyncio.sleep(0.01)
        return harness.engine.stats()

    return harness.run(wait())


def noise(seconds: float, seed: int) -> MediaInput:
    rng = np.random.default_rng(seed)
    return MediaInput("audio", (0.1 * rng.standard_normal(int(16000 * seconds))).astype(np.float32), 16000)


def converse(harness: Harness, session: str, media: list[tuple[MediaInput, ...]]) -> None:
    """One turn per ``media`` entry; each turn's greedy tokens with the kept KV must equal a full
    prefill's, and each reuses at least the whole previous prompt."""
    turns: list[ChatTurn] = [ChatTurn(role="system", text="You are terse.")]
    previous_prompt = 0
    for index, parts in enumerate(media):
        turns.append(ChatTurn(role="user", text=f"Question {index}: why?", media=parts))
        before = settled(harness)
        kept = harness.collect(ask(turns, session=session))
        after = settled(harness)
        full = harness.collect(ask(turns, session=None))
        assert token_ids(kept) == token_ids(full) and token_ids(kept), f"turn {index}"
        hits = after.session_kv_hits - before.session_kv_hits
        reused = after.session_kv_reused_tokens - before.session_kv_reused_tokens
        assert (hits, after.session_kv_misses - before.session_kv_misses) == ((1, 0) if index else (0, 1))
        # Every earlier prompt token is reused (and the reply tokens that re-tokenise the same).
        prompt = finished(kept).usage.prompt_tokens
        assert previous_prompt <= reused == finished(kept).usage.cached_tokens < prompt
        previous_prompt = prompt
        turns.append(ChatTurn(role="assistant", text=reply_text(kept)))
    assert session in harness.engine.stages.local.thinker.kv
    harness.run(_end(harness, session))
    assert session not in harness.engine.stages.local.thinker.kv


def test_text_and_audio_turns_equal_a_full_prefill(speech_engine: Harness) -> None:
    converse(speech_engine, "conv-a", [(), (tone(0.6),), (), (tone(1.0), image(seed=3))])


def test_qwen3_turns_with_deepstack_images_equal_a_full_prefill(tiny_checkpoint: Path) -> None:
    """Qwen3-Omni adds DeepStack features at visual positions during prefill: an image in a later
    turn lies after the kept prefix, so its features land at the suffix's own positions."""
    from omni_runtime.models.qwen3_omni_moe.tiny import ensure_tiny_checkpoint

    harness = Harness(tiny_options(ensure_tiny_checkpoint(progress=False), pipeline="text"))
    try:
        converse(harness, "conv-q3", [(image(seed=1),), (), (image(seed=2),), (tone(0.6),)])
    finally:
        harness.close()


async def _end(harness: Harness, session: str) -> None:
    harness.engine.end_session(session)


def talker_positions(harness: Harness, ids: list[int]) -> list[int]:
    """The ids of a thinker prompt's positions the talker's prompt starts with, one each: all of
    them for Qwen2.5-Omni; the user turns' for Qwen3-Omni (talker_prompt.user_positions)."""
    from omni_runtime.models.qwen3_omni_moe.talker import Qwen3TalkerRunner
    from omni_runtime.models.qwen3_omni_moe.talker_prompt import user_positions

    runner = harness.engine.stages.local.talker.runner
    if isinstance(runner, Qwen3TalkerRunner):
        return [ids[i] for i in user_positions(ids, runner.turns)]
    return list(ids)


def test_speech_turns_hand_the_talker_the_same_prompt(family_speech_engine: Harness) -> None:
    """A speech turn after a kept prefix: the thinker's tokens equal a full prefill's; the talker
    restores its own kept KV of the previous turn's prompt (where the thinker reused, so its
    vectors there are the kept ones), prefills the rest, and speaks the same audio. Qwen2.5's
    talker prompt is the thinker prompt, position for position; Qwen3's is the user turns (then
    this turn's assistant part), so it keeps and reuses the first turn's user positions."""
    speech_engine = family_speech_engine
    talker_kv = speech_engine.engine.stages.local.talker.kv
    turns = [ChatTurn(role="user", text="Say hi.", media=(tone(0.5),))]
    first_prompt = speech_engine.engine.adapter.preprocess(ask(turns, session=None)).input_ids
    first_prompt = talker_positions(speech_engine, first_prompt)
    first = speech_engine.collect(ask(turns, session="conv-s", want_audio=True))
    turns += [ChatTurn(role="assistant", text=reply_text(first)), ChatTurn(role="user", text="Again.")]
    before = settled(speech_engine)
    talker_before = talker_kv.counters()
    kept = speech_engine.collect(ask(turns, session="conv-s", want_audio=True))
    after = settled(speech_engine)
    talker_after = talker_kv.counters()
    full = speech_engine.collect(ask(turns, session=None, want_audio=True))
    assert after.session_kv_hits - before.session_kv_hits == 1
    # the talker reused its previous prompt (the reply after it was codes, not prompt)
    assert talker_after.hits - talker_before.hits == 1
    # ... and the worker's stats (/metrics: omni_talker_kv_*) say so
    assert (after.talker_kv_hits, after.talker_kv_reused_tokens) == (
        talker_after.hits,
        talker_after.reused_tokens,
    )
    from omni_runtime.api.metrics import ApiMetrics

    text = ApiMetrics(stats=lambda: after, in_flight=lambda: 0).render().decode()
    assert f"omni_talker_kv_reused_tokens_total {float(talker_after.reused_tokens)}" in text
    assert talker_after.reused_tokens - talker_before.reused_tokens == len(first_prompt)
    assert token_ids(kept) == token_ids(full)
    audio = [np.concatenate([e.pcm for e in ev if isinstance(e, AudioChunk)]) for ev in (kept, full)]
    assert audio[0].size == audio[1].size > 0
    np.testing.assert_allclose(audio[0], audio[1], atol=1e-3)


def test_other_audio_at_the_same_place_is_not_reused(speech_engine: Harness) -> None:
    """Same ids and positions (audio of the same length), other sound: the prefix stops at the
    first audio placeholder, and the answer is the full prefill's."""
    first = [ChatTurn(role="user", text="Listen.", media=(noise(0.6, seed=1),))]
    said = reply_text(speech_engine.collect(ask(first, session="conv-m")))
    other = [
        ChatTurn(role="user", text="Listen.", media=(noise(0.6, seed=2),)),
        ChatTurn(role="assistant", text=said),
        ChatTurn(role="user", text="And now?"),
    ]
    request = ask(other, session="conv-m")
    ids = speech_engine.engine.adapter.preprocess(request).input_ids
    audio_token = int(speech_engine.engine.stages.local.thinker.runner.media_ids[0])
    before = settled(speech_engine)
    kept = speech_engine.collect(request)
    after = settled(speech_engine)
    assert after.session_kv_reused_tokens - before.session_kv_reused_tokens == ids.index(audio_token)
    assert token_ids(kept) == token_ids(speech_engine.collect(ask(other, session=None)))


@pytest.fixture(scope="module")
def small_budget(tiny_checkpoint: Path) -> Iterator[Harness]:
    # 1 MiB: the tiny thinker keeps 1 KiB a token, so about three of these conversations fit.
    harness = Harness(tiny_options(tiny_checkpoint, pipeline="text", session_kv_mb=1))
    yield harness
    harness.close()


def test_eviction_under_a_small_budget_rebuilds_by_a_full_prefill(small_budget: Harness) -> None:
    long_text = " ".join(f"item {i} is {i * 7 % 13}." for i in range(40))
    sessions = [f"conv-{i}" for i in range(4)]
    histories = {s: [ChatTurn(role="user", text=f"{s}: {long_text}")] for s in sessions}
    for session in sessions:
        events = small_budget.collect(ask(histories[session], session=session))
        histories[session] += [ChatTurn(role="assistant", text=reply_text(events))]
        histories[session] += [ChatTurn(role="user", text="Go on.")]
    stats = settled(small_budget)
    store = small_budget.engine.stages.local.thinker.kv
    assert stats.session_kv_evictions >= 1 and stats.session_kv_bytes <= 1 << 20
    assert "conv-0" not in store and "conv-3" in store  # least recently used left first
    for session, expect_hit in (("conv-0", False), ("conv-3", True)):
        before = settled(small_budget)
        again = small_budget.collect(ask(histories[session], session=session))
        after = settled(small_budget)
        assert after.session_kv_hits - before.session_kv_hits == int(expect_hit)
        assert after.session_kv_misses - before.session_kv_misses == int(not expect_hit)
        assert token_ids(again) == token_ids(small_budget.collect(ask(histories[session], session=None)))
    small_budget.run(_end(small_budget, "conv-3"))
    assert "conv-3" not in store


def test_a_barge_in_keeps_what_was_fed_and_the_trimmed_history_reuses_it(speech_engine: Harness) -> None:
    """A reply cancelled after a few tokens keeps them; the next turn's history holds only what
    the user heard (less than was generated), and the reuse stops exactly there."""
    engine = speech_engine.engine
    turns = [ChatTurn(role="user", text="Tell me a long story.")]
    first = ask(turns, session="conv-b")

    async def interrupted() -> list[TextDelta]:
        heard: list[TextDelta] = []
        stream = engine.generate(first)
        async for event in stream:
            if isinstance(event, TextDelta) and event.text:
                heard.append(event)
            if len(heard) == 4:
                break
        await stream.aclose()  # barge-in: the response is cancelled
        return heard

    heard = speech_engine.run(interrupted())
    before = settled(speech_engine)
    prompt1 = len(engine.adapter.preprocess(first).input_ids)
    turns += [
        ChatTurn(role="assistant", text="".join(d.text for d in heard[:2])),  # what was played
        ChatTurn(role="user", text="Stop. Something else?"),
    ]
    kept = speech_engine.collect(ask(turns, session="conv-b"))
    after = settled(speech_engine)
    assert after.session_kv_hits - before.session_kv_hits == 1
    assert prompt1 <= finished(kept).usage.cached_tokens < finished(kept).usage.prompt_tokens
    assert token_ids(kept) == token_ids(speech_engine.collect(ask(turns, session=None)))


def test_two_turns_of_one_session_at_once_each_answer_exactly(speech_engine: Harness) -> None:
    """Two requests of one session in flight together: at most one takes the kept entry, the
    other prefills in full, and both answer what a full prefill answers."""
    base = [ChatTurn(role="user", text="Count.")]
    said = reply_text(speech_engine.collect(ask(base, session="conv-c")))
    settled(speech_engine)
    history = [*base, ChatTurn(role="assistant", text=said)]
    variants = [[*history, ChatTurn(role="user", text=t)] for t in ("More.", "Less.")]

    async def together() -> list[list[int]]:
        async def one(turns: list[ChatTurn]) -> list[int]:
            return token_ids([e async for e in speech_engine.engine.generate(ask(turns, session="conv-c"))])

        return list(await asyncio.gather(*(one(t) for t in variants)))

    before = settled(speech_engine)
    both = speech_engine.run(together())
    after = settled(speech_engine)
    assert both == [token_ids(speech_engine.collect(ask(t, session=None))) for t in variants]
    assert after.session_kv_hits - before.session_kv_hits <= 1
    assert (after.session_kv_hits + after.session_kv_misses) - (
        before.session_kv_hits + before.session_kv_misses
    ) == 2


def test_a_warmed_history_serves_the_next_turn_and_a_text_turn_serves_speech(speech_engine: Harness) -> None:
    """Engine.warm_session prefills a session's history with no output; the next turn (here with
    speech out after a text turn: session rows keep the talker's vectors on a speaking worker)
    reuses it, and answers exactly what a full prefill answers."""
    engine = speech_engine.engine
    history = [
        ChatTurn(role="system", text="Be kind."),
        ChatTurn(role="user", text="Hello."),
        ChatTurn(role="assistant", text="Hi, how can I help?"),
    ]
    warm = ask(history, session="conv-w")
    assert speech_engine.run(engine.warm_session(warm)) == 0  # nothing kept before
    warm_prompt = len(engine.adapter.preprocess(warm).input_ids)
    settled(speech_engine)
    turns = [*history, ChatTurn(role="user", text="Tell me more.", media=(tone(0.4),))]
    kept = speech_engine.collect(ask(turns, session="conv-w", want_audio=True))
    opening = len(engine.adapter.tokenizer.encode("assistant\n", add_special_tokens=False))
    assert finished(kept).usage.cached_tokens == warm_prompt - opening
    assert token_ids(kept) == token_ids(speech_engine.collect(ask(turns, session=None, want_audio=True)))
    with pytest.raises(EngineError) as refused:
        speech_engine.run(engine.warm_session(ask(history, session=None)))
    assert refused.value.param == "session_key"


async def _events(harness: Harness, request: GenerationRequest) -> list[Any]:
    return [event async for event in harness.engine.generate(request)]


def second_turns_together(harness: Harness, tag: str, media: list[tuple[tuple, tuple]]) -> None:
    """One first turn per session (prompts and kept prefixes of different lengths), then every
    session's second turn admitted in one thinker step: their suffixes prefill as one batch, each
    after its own prefix, with exactly the greedy tokens of a full prefill."""
    conversations: list[list[ChatTurn]] = []
    for k, (first_media, second_media) in enumerate(media):
        turns = [
            ChatTurn(role="system", text="You are terse."),
            ChatTurn(role="user", text=f"Question {k}:" + " why" * (1 + 3 * k), media=first_media),
        ]
        said = reply_text(harness.collect(ask(turns, session=f"{tag}-{k}")))
        turns += [
            ChatTurn(role="assistant", text=said),
            ChatTurn(role="user", text="Then?", media=second_media),
        ]
        conversations.append(turns)
    before = settled(harness)
    runner = harness.engine.stages.local.thinker.runner
    batches: list[int] = []
    prefill_suffixes = runner._prefill_suffixes

    def recording(rows: Any, which: list[int], *rest: Any) -> None:
        batches.append(len(which))
        prefill_suffixes(rows, which, *rest)

    async def together() -> list[list[Any]]:
        thinker = harness.engine.stages.thinker
        async with thinker.hold():  # every second turn waits, then one step admits them all
            tasks = [
                asyncio.create_task(_events(harness, ask(turns, session=f"{tag}-{k}")))
                for k, turns in enumerate(conversations)
            ]
            while thinker.waiting_count < len(tasks):
                await asyncio.sleep(0.01)
        return list(await asyncio.gather(*tasks))

    runner._prefill_suffixes = recording
    try:
        kept = harness.run(together())
    finally:
        del runner._prefill_suffixes
    after = settled(harness)
    assert batches == [len(media)]  # one prefill of every suffix
    assert after.session_kv_hits - before.session_kv_hits == len(media)
    for k, turns in enumerate(conversations):
        full = harness.collect(ask(turns, session=None))
        assert token_ids(kept[k]) == token_ids(full) and token_ids(full), f"session {k}"
        assert 0 < finished(kept[k]).usage.cached_tokens < finished(full).usage.prompt_tokens


def test_several_sessions_suffixes_prefill_as_one_batch(speech_engine: Harness) -> None:
    second_turns_together(
        speech_engine,
        "batch",
        [((), ()), ((tone(0.6),), ()), ((), (tone(0.8),)), ((), (image(seed=4),))],
    )


def test_qwen3_suffixes_with_deepstack_images_prefill_as_one_batch() -> None:
    """Each row's DeepStack features land at its own suffix positions (per-row offsets)."""
    from omni_runtime.models.qwen3_omni_moe.tiny import ensure_tiny_checkpoint

    harness = Harness(tiny_options(ensure_tiny_checkpoint(progress=False), pipeline="text"))
    try:
        second_turns_together(
            harness,
            "q3batch",
            [((image(seed=1),), ()), ((), (image(seed=2),)), ((), ()), ((image(seed=5),), (image(seed=6),))],
        )
    finally:
        harness.close()


def assert_rows_agree(runner: Any, rows: list[Any]) -> None:
    """Admit ``rows`` (slots 1 and 2: the same prompt, after a kept prefix and in full) together:
    the same cache over the prompt, every layer, and the same greedy codes for 6 more steps."""
    import torch

    codes = [runner.admit(rows)]
    length = runner.prompt_length(rows[1])
    cache = runner.decoder.cache
    for layer in range(len(cache.keys)):
        for buffers in (cache.keys, cache.values):
            torch.testing.assert_close(
                buffers[layer][1, :, :length], buffers[layer][2, :, :length], rtol=1e-4, atol=1e-5
            )
    pad = runner.text_vector("pad")
    for i in range(6):
        codes.append(runner.step(3, inputs=[None, pad, pad], max_length=length + 1 + i)[1:])
    assert all(step[0] == step[1] for step in codes), codes


def test_the_talker_after_its_kept_prompt_writes_the_cache_a_full_prefill_writes(
    speech_engine: Harness,
) -> None:
    """Runner level, exact: a talker row restored from its session's kept prompt KV and prefilled
    after it holds the same cache (every layer's keys and values, rotated at the suffix's own
    positions) and draws the same greedy codes as a row prefilled in full, in one admission."""
    import dataclasses

    import torch

    from omni_runtime.contract.adapter import RowSampling, TalkerAdmission

    runner = speech_engine.engine.adapter.talker_runner(slots=4, max_len=512)
    hidden = runner.talker.config.embedding_size
    generator = torch.Generator().manual_seed(7)
    ids = speech_engine.engine.adapter.preprocess(
        ask([ChatTurn(role="user", text="Hi.")], session=None)
    ).input_ids
    more = ids[-5:] + ids[:7]
    vectors = torch.randn(len(ids) + len(more), hidden, generator=generator)
    voice = next(iter(runner.speakers))
    greedy = RowSampling(temperature=0.0)
    first = TalkerAdmission(
        0, ids, {}, vectors[: len(ids)], 11, torch.randn(hidden, generator=generator), voice, greedy
    )
    runner.admit([first])
    kept = runner.keep(slot=0, length=len(ids))
    longer = dataclasses.replace(first, input_ids=[*ids, *more], prompt_vectors=vectors, first_token=12)
    rows = [
        dataclasses.replace(longer, slot=1, prefix=kept, prefix_length=len(ids)),
        dataclasses.replace(longer, slot=2),
    ]
    assert_rows_agree(runner, rows)


def test_the_talker_reuses_no_more_than_its_thinker_did(family_speech_engine: Harness) -> None:
    """Other audio where the first turn had some: the thinker's prefix stops at that audio's first
    placeholder, and the talker (whose vectors past it are new) stops there too."""
    speech_engine = family_speech_engine
    talker_kv = speech_engine.engine.stages.local.talker.kv
    first = [ChatTurn(role="user", text="Listen.", media=(noise(0.6, seed=3),))]
    said = reply_text(speech_engine.collect(ask(first, session="conv-t", want_audio=True)))
    other = [
        ChatTurn(role="user", text="Listen.", media=(noise(0.6, seed=4),)),
        ChatTurn(role="assistant", text=said),
        ChatTurn(role="user", text="And now?"),
    ]
    before, talker_before = settled(speech_engine), talker_kv.counters()
    speech_engine.collect(ask(other, session="conv-t", want_audio=True))
    after, talker_after = settled(speech_engine), talker_kv.counters()
    thinker_reused = after.session_kv_reused_tokens - before.session_kv_reused_tokens
    assert thinker_reused > 0
    prompt = speech_engine.engine.adapter.preprocess(ask(other, session=None)).input_ids
    expected = len(talker_positions(speech_engine, prompt[:thinker_reused]))
    assert talker_after.reused_tokens - talker_before.reused_tokens == expected > 0


def test_the_qwen3_talker_after_its_kept_user_turns_writes_what_a_full_prefill_writes(
    qwen3_speech_engine: Harness,
) -> None:
    """Runner level, Qwen3-Omni: the talker keeps the first turn's user positions (its prompt's
    assistant part is that turn's own); the next turn's row restored from them and prefilled after
    them (this turn's user positions, its assistant part) holds the same cache as a row prefilled
    in full, and draws the same greedy frames, in one admission."""
    import dataclasses

    import torch

    from omni_runtime.contract.adapter import RowSampling, TalkerAdmission
    from omni_runtime.models.qwen3_omni_moe.talker_prompt import ASSISTANT_HEADER

    adapter = qwen3_speech_engine.engine.adapter
    runner = adapter.talker_runner(slots=4, max_len=512)
    hidden = runner.talker.text_projection.linear_fc1.in_features
    generator = torch.Generator().manual_seed(7)
    turns = [ChatTurn(role="system", text="Be brief."), ChatTurn(role="user", text="Hi.")]
    first_ids = adapter.preprocess(ask(turns, session=None)).input_ids
    turns += [ChatTurn(role="assistant", text="Hello there."), ChatTurn(role="user", text="More, please.")]
    ids = adapter.preprocess(ask(turns, session=None)).input_ids
    assert ids[: len(first_ids)] == first_ids
    vectors = torch.randn(len(ids), hidden, generator=generator)
    voice = next(iter(runner.speakers))
    greedy = RowSampling(temperature=0.0)
    first = TalkerAdmission(
        0,
        first_ids,
        {},
        vectors[: len(first_ids)],
        11,
        torch.randn(hidden, generator=generator),
        voice,
        greedy,
    )
    runner.admit([first])
    kept_length = runner.kept_length(first)
    # The user turn from its <|im_start|> through its <|im_end|>: not the system turn before it, not
    # the assistant header after it.
    user_start = first_ids.index(runner.turns.user) - 1
    assert kept_length == len(first_ids) - user_start - ASSISTANT_HEADER
    kept = runner.keep(slot=0, length=kept_length)
    longer = dataclasses.replace(first, input_ids=ids, prompt_vectors=vectors, first_token=12)
    reused = runner.shared_length(longer, len(first_ids))
    assert reused == kept_length  # every kept user position, none of the first turn's assistant part
    rows = [
        dataclasses.replace(longer, slot=1, prefix=kept, prefix_length=reused),
        dataclasses.replace(longer, slot=2),
    ]
    assert_rows_agree(runner, rows)
