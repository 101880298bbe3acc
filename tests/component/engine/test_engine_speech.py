"""Speech out: the talker follows the thinker, the vocoder turns codec windows into 24 kHz audio."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from engine_harness import Harness, finished, request, tiny_options

from omni_runtime.contract.engine import AudioChunk, EngineError, TextDelta
from omni_runtime.pipeline.segmenter import CodecSegmenter, family_config


class VocoderSpy:
    """Wraps the real vocoder to record the code windows it synthesised."""

    def __init__(self, vocoder) -> None:
        self.vocoder = vocoder
        self.windows: list[tuple[int, int]] = []
        self.calls = 0
        self.batches: list[list[tuple[int, int]]] = []  # each call's windows

    def __getattr__(self, name: str):
        return getattr(self.vocoder, name)

    def synthesize_many(self, items):
        windows = [(item["window"]["start"], item["window"]["end"]) for item in items]
        self.windows.extend(windows)
        self.batches.append(windows)
        self.calls += 1
        return self.vocoder.synthesize_many(items)


@pytest.fixture(scope="module")
def batch_speech_engine(tiny_checkpoint: Path) -> Iterator[Harness]:
    harness = Harness(tiny_options(tiny_checkpoint, pipeline="speech"))
    yield harness
    harness.close()


@pytest.fixture(scope="module")
def text_engine(tiny_checkpoint: Path) -> Iterator[Harness]:
    harness = Harness(tiny_options(tiny_checkpoint, pipeline="text"))
    yield harness
    harness.close()


@contextlib.contextmanager
def admissions(runner) -> Iterator[list]:
    """The rows the real talker runner admits while the block runs."""
    seen: list = []
    admit = runner.admit

    def recording(rows):
        seen.extend(rows)
        return admit(rows)

    runner.admit = recording
    try:
        yield seen
    finally:
        runner.admit = admit


def _spy(harness: Harness) -> VocoderSpy:
    local = harness.engine.stages.local
    spy = VocoderSpy(local.vocoder)
    local.vocoder = spy
    return spy


def test_speech_audio_is_24khz_and_its_length_matches_the_codec_tokens(batch_speech_engine: Harness) -> None:
    spy = _spy(batch_speech_engine)
    try:
        events = batch_speech_engine.collect(request(max_tokens=12, want_audio=True, talker_tokens=30))
    finally:
        batch_speech_engine.engine.stages.local.vocoder = spy.vocoder
    chunks = [e for e in events if isinstance(e, AudioChunk)]
    assert chunks, "a speech request must produce audio"
    assert {c.sample_rate for c in chunks} == {24000}
    samples = sum(len(c.pcm) for c in chunks)
    codes = sum(end - start for start, end in spy.windows)
    assert 0 < codes <= 30
    assert samples == codes * spy.vocoder.samples_per_code == codes * 480  # 2 mel frames x 240 samples
    assert [w[0] for w in spy.windows] == [0] + [w[1] for w in spy.windows[:-1]], (
        "windows must tile the codes"
    )
    # Non-streaming speech cuts the finished codes into the streaming windows (each cancellable),
    # all submitted at once: one vocoder call per window shape (a call runs one shape), and one
    # audio chunk.
    windows = batch_speech_engine.engine.adapter.codec_windows  # the family's (with its ramp)
    expected = CodecSegmenter(family_config(windows, at_end=True)).push(codes, done=True)
    assert spy.windows == [(w.start, w.end) for w in expected]
    assert spy.calls == len({w.ctx_end - w.ctx_start for w in expected}) and len(chunks) == 1
    assert all(c.pcm.dtype == np.float32 and np.all(np.abs(c.pcm) <= 1.0) for c in chunks)
    done = finished(events)
    assert done.usage.audio_seconds == pytest.approx(samples / 24000)


def test_streaming_speech_sends_first_audio_before_the_thinker_finishes(speech_engine: Harness) -> None:
    events = speech_engine.collect(request(max_tokens=600, want_audio=True, talker_tokens=60))
    kinds = [type(e).__name__ for e in events]
    first_audio = kinds.index("AudioChunk")
    last_text = max(i for i, k in enumerate(kinds) if k == "TextDelta")
    assert first_audio < last_text, f"first audio at event {first_audio}, text ended at {last_text}"
    chunks = [e for e in events if isinstance(e, AudioChunk)]
    assert len(chunks) >= 2, "streaming speech sends audio in several chunks"
    assert finished(events).usage.completion_tokens == 600


def test_streaming_speech_with_a_seed_repeats_its_audio(speech_engine: Harness) -> None:
    def audio(seed: int) -> np.ndarray:
        events = speech_engine.collect(
            request(max_tokens=10, temperature=1.0, seed=seed, want_audio=True, talker_tokens=25)
        )
        return np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)])

    first, again, other = audio(7), audio(7), audio(8)
    # Same codes and same vocoder noise; CPU thread pools shared by the stage threads may reorder
    # float reductions, so equality is up to rounding.
    assert first.shape == again.shape
    assert np.abs(first - again).max() < 1e-3
    assert first.shape != other.shape or np.abs(first - other).max() > 1e-2


def test_text_pipeline_refuses_audio_output(text_engine: Harness) -> None:
    with pytest.raises(EngineError) as err:
        text_engine.collect(request(want_audio=True))
    assert err.value.param == "modalities"
    events = text_engine.collect(request(max_tokens=4))
    assert any(isinstance(e, TextDelta) for e in events)
    assert not any(isinstance(e, AudioChunk) for e in events)


class SlowVocoder(VocoderSpy):
    """The real vocoder, taking `delay_s` longer per call, as one shared by many streams does: the
    talker keeps making codes meanwhile. Records each window with its context."""

    def __init__(self, vocoder, delay_s: float) -> None:
        super().__init__(vocoder)
        self.delay_s = delay_s
        self.items: list[dict] = []

    def synthesize_many(self, items):
        import time

        time.sleep(self.delay_s)
        self.items.extend(dict(item["window"]) for item in items)
        return super().synthesize_many(items)


def test_a_stream_behind_its_talker_catches_up_in_larger_windows(family_speech_engine: Harness) -> None:
    """When the vocoder is slower than the talker, each window after the first covers the codes
    that exist when it is cut (up to the steady size, at a captured graph's size), instead of
    queueing the planned ramp windows one vocoder call after another. One window at a time (a
    window cut while the one before is at the vocoder has only the codes of that moment)."""
    from dataclasses import replace

    from omni_runtime.pipeline.segmenter import SegmenterConfig

    harness = family_speech_engine
    # 0.8 s a call: slower than the tiny talker's codes even on a loaded machine (at 0.4 s Qwen3's
    # talker kept pace with it once, in a CI run at half its usual speed, and no window caught up)
    spy = SlowVocoder(harness.engine.stages.local.vocoder, delay_s=0.8)
    harness.engine.stages.local.vocoder = spy
    ahead, harness.engine.windows_ahead = harness.engine.windows_ahead, 1
    try:
        base = request(max_tokens=40, want_audio=True, talker_tokens=90)
        greedy = replace(base, stage_params={"talker": {"max_tokens": 90, "temperature": 0.0}})
        events = harness.collect(greedy)
    finally:
        harness.engine.stages.local.vocoder = spy.vocoder
        harness.engine.windows_ahead = ahead
    codes = spy.items[-1]["end"]
    assert codes >= 40, f"the tiny talker ended after {codes} codes: too few to show catch-up"
    windows = harness.engine.adapter.codec_windows
    config = family_config(windows)
    sizes = CodecSegmenter(config).recurring_sizes()
    assert [w["start"] for w in spy.items] == [0] + [w["end"] for w in spy.items[:-1]], "windows tile"
    for w in spy.items[:-1]:  # the last may be short of right context (widened to a size if it can)
        assert w["ctx_end"] - w["ctx_start"] in sizes, w
    planned = CodecSegmenter(SegmenterConfig(**{**config.__dict__, "catch_up": False})).push(codes, done=True)
    assert len(spy.items) < len(planned), (spy.items, planned)
    assert any(w["end"] - w["start"] > p.end - p.start for w, p in zip(spy.items, planned, strict=False))
    samples = sum(len(e.pcm) for e in events if isinstance(e, AudioChunk))
    per_code = spy.vocoder.samples_per_code
    # Qwen3's last window, with no frame after it, ends a little short of its last frame's samples
    assert codes * per_code - per_code < samples <= codes * per_code


def test_a_short_last_window_takes_the_busy_streams_size(speech_engine: Harness) -> None:
    """A lone reply of 50 codes in the planned windows (10, 10, 20, then the rest): its last
    window, codes 40-50 with 20 of context, is widened to the busy first window's context (27), a
    size busy streams' early windows share a vocoder batch at, not to the smallest size that fits."""
    engine = speech_engine.engine
    spy = SlowVocoder(engine.stages.local.vocoder, delay_s=0.0)
    windows = engine.adapter.codec_windows
    engine.stages.local.vocoder, engine.adapter.codec_windows = spy, {**windows, "catch_up": False}
    try:
        talker = {"max_tokens": 50, "codes_per_text_token": 0, "ignore_eos": True, "temperature": 0.0}
        base = request(max_tokens=8, want_audio=True, talker_tokens=50)
        speech_engine.collect(replace(base, stage_params={"talker": talker}))
    finally:
        engine.stages.local.vocoder, engine.adapter.codec_windows = spy.vocoder, windows
    busy = CodecSegmenter(family_config(windows)).busy_size
    assert busy == 27 and 25 in CodecSegmenter(family_config(windows)).recurring_sizes()
    assert [(w["start"], w["end"]) for w in spy.items] == [(0, 10), (10, 20), (20, 40), (40, 50)]
    assert (spy.items[-1]["ctx_start"], spy.items[-1]["ctx_end"]) == (50 - busy, 50)


def test_talker_rows_admitted_together_draw_what_they_draw_alone(family_speech_engine: Harness) -> None:
    """The talker prefills the prompts of every stream that reaches it together in one padded
    batch (one call, not one per stream); each row's first code and decode state are the ones it
    gets admitted alone, whatever the other rows' prompt lengths."""
    from dataclasses import replace

    harness = family_speech_engine
    runner = harness.engine.stages.local.talker.runner
    with admissions(runner) as seen:
        for prompt in ("Hi.", "Tell me a much longer story about a robot who sails the sea.", "What?"):
            harness.collect(request(prompt, max_tokens=4, want_audio=True, talker_tokens=6))
    rows = [
        replace(row, slot=i, sampling=replace(row.sampling, temperature=1.0, seed=11 + i))
        for i, row in enumerate(seen)
    ]
    assert len({len(r.input_ids) for r in rows}) == 3, "the prompts differ in length"
    decoder = runner.decoder

    def state() -> list[tuple[int, int]]:
        return [(int(decoder.lengths[r.slot]), int(decoder.rope_delta[r.slot])) for r in rows]

    logits: list = []  # each prefill's last-position logits, as the sampler gets them
    prefill = decoder.prefill

    def capturing(**kwargs):
        out = prefill(**kwargs)
        logits.append(out[0].float().cpu())
        return out

    decoder.prefill = capturing
    try:
        alone = [runner.admit([row])[0] for row in rows]
        alone_state = state()
        together = runner.admit(rows)
    finally:
        decoder.prefill = prefill
    assert len(logits) == 4, "three prefills alone, then one for all three rows"
    import torch

    torch.testing.assert_close(logits[3], torch.cat(logits[:3]), rtol=1e-4, atol=1e-4)
    assert together == alone
    assert state() == alone_state


def test_a_reply_that_starts_while_another_speaks_gets_the_busy_first_window(
    family_speech_engine: Harness,
) -> None:
    """With ``busy_streams`` 2, a reply alone cuts the family's first window; one that starts
    while another reply is still speaking cuts ``first_chunk_busy`` codes instead (the engine
    counts its streaming speech replies; the segmenter's table tests cover the windows after it)."""
    from dataclasses import replace

    harness = family_speech_engine
    engine = harness.engine
    family = dict(engine.adapter.codec_windows)
    first = family["first_chunk"]
    busy = {**family, "first_chunk_busy": 2 * first, "busy_streams": 2}
    spy = VocoderSpy(engine.stages.local.vocoder)
    engine.stages.local.vocoder = spy

    def greedy(tokens: int, codes: int):
        base = request(max_tokens=tokens, want_audio=True, talker_tokens=codes)
        return replace(base, stage_params={"talker": {"max_tokens": codes, "temperature": 0.0}})

    async def two() -> tuple[list, list, int]:
        long = engine.generate(greedy(200, 400))
        before = []
        async for event in long:  # the long reply alone, until its first audio
            if not before:  # counted from its acceptance, before its talker starts
                assert engine.stats().speech_replies == 1
            before.append(event)
            if isinstance(event, AudioChunk):
                break
        assert engine.stats().speech_replies == 1
        windows_alone = list(spy.windows)
        rest = asyncio.ensure_future(_drain(long))
        second = [event async for event in engine.generate(greedy(8, 3 * first + 10))]
        live = not rest.done()  # the long reply still spoke when the second one ended
        await rest
        return windows_alone, second, live

    engine.adapter.codec_windows = busy
    busy_before = engine.stats().busy_first_windows
    try:
        alone, second, live = harness.run(two())
    finally:
        engine.adapter.codec_windows = family
        engine.stages.local.vocoder = spy.vocoder
    assert live, "the long reply ended before the second: nothing was measured under load"
    assert alone[0] == (0, first)  # alone: the family's first window
    firsts = [w for w in spy.windows if w[0] == 0]
    assert firsts == [(0, first), (0, 2 * first)], spy.windows
    assert any(isinstance(e, AudioChunk) for e in second)
    stats = engine.stats()  # what /metrics shows: omni_speech_replies, omni_busy_first_windows_total
    assert stats.speech_replies == 0 and stats.busy_first_windows == busy_before + 1


LONG_FIRST = 40  # long first windows: a second reply's talker starts long before the first's is cut


def _long_greedy():
    base = request(max_tokens=100, want_audio=True, talker_tokens=2 * LONG_FIRST)
    return replace(base, stage_params={"talker": {"max_tokens": 2 * LONG_FIRST, "temperature": 0.0}})


@contextlib.contextmanager
def _waiting_for_any_first_window(engine) -> Iterator[None]:
    """Long first windows and a wait with no reach limit and a 30 s bound, so a test never races
    the talker for the moment a first window waits; the engine's settings come back after."""
    family = dict(engine.adapter.codec_windows)
    saved = (engine.first_linger_codes, engine.first_linger_s)
    engine.adapter.codec_windows = {**family, "first_chunk": LONG_FIRST, "busy_streams": 99}
    engine.first_linger_codes, engine.first_linger_s = 10_000, 30.0
    try:
        yield
    finally:
        engine.adapter.codec_windows = family
        engine.first_linger_codes, engine.first_linger_s = saved


def test_a_first_window_waits_for_another_replys_to_share_one_vocoder_call(speech_engine: Harness) -> None:
    """A reply started while another is in its first tokens is some codes behind it; the first
    reply's first window, once ready, waits for the second's (deadlines.lingers: here however far,
    and for up to 30 s, so the test does not race the talker) and both go to the vocoder in one
    call. What each reply hears is unchanged (greedy, seeded)."""
    engine = speech_engine.engine
    first = LONG_FIRST
    spy = _spy(speech_engine)

    async def staggered() -> tuple[list, list]:
        leader = engine.generate(_long_greedy())
        led: list = []
        follower = None
        async for event in leader:
            led.append(event)
            if follower is None and isinstance(event, TextDelta):  # the leader's talker has started
                follower = asyncio.ensure_future(_collect(engine.generate(_long_greedy())))
        assert follower is not None
        return led, await follower

    before = engine.stats()
    try:
        with _waiting_for_any_first_window(engine):
            led, followed = speech_engine.run(staggered())
    finally:
        engine.stages.local.vocoder = spy.vocoder
    firsts = [batch for batch in spy.batches if (0, first) in batch]
    assert firsts == [[(0, first), (0, first)]], spy.batches  # both first windows, one call
    after = engine.stats()
    assert after.lingered_first_windows == before.lingered_first_windows + 1  # the leader's waited
    assert after.first_window_linger_seconds > before.first_window_linger_seconds
    for events in (led, followed):
        assert finished(events).reason in ("stop", "length")
        assert sum(len(e.pcm) for e in events if isinstance(e, AudioChunk)) > 0


def test_a_reply_that_ends_before_its_first_window_releases_the_one_waiting(speech_engine: Harness) -> None:
    """The reply a first window waits for is cancelled before its own is cut: the waiting one goes
    then, not at the end of its bound (30 s here)."""
    engine = speech_engine.engine

    async def cancel_once_the_leader_waits(follower: asyncio.Future) -> float:
        for _ in range(10_000):  # at most 10 s
            if engine._first_window_waiters:  # the leader's first window is waiting
                follower.cancel()  # the follower's is not cut yet: it was 1 code away or more
                return time.monotonic()
            await asyncio.sleep(0.001)
        raise AssertionError("the leader's first window never waited")

    async def leader_waits_for_a_cancelled_follower() -> tuple[list, float]:
        leader = engine.generate(_long_greedy())
        led: list = []
        follower = canceller = None
        first_audio = None
        async for event in leader:
            led.append(event)
            if follower is None and isinstance(event, TextDelta):
                follower = asyncio.ensure_future(_collect(engine.generate(_long_greedy())))
                canceller = asyncio.ensure_future(cancel_once_the_leader_waits(follower))
            if isinstance(event, AudioChunk) and first_audio is None:
                first_audio = time.monotonic()
        assert follower is not None and canceller is not None and first_audio is not None
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        return led, first_audio - await canceller

    before = engine.stats()
    with _waiting_for_any_first_window(engine):
        led, after_cancel = speech_engine.run(leader_waits_for_a_cancelled_follower())
    assert after_cancel < 5.0  # released by the cancel, far inside the 30 s bound
    assert engine.stats().lingered_first_windows == before.lingered_first_windows + 1
    assert finished(led).reason in ("stop", "length")
    assert not engine._first_window_need and not engine._first_window_waiters


def test_the_first_window_wait_rules_at_the_default_reach(speech_engine: Harness) -> None:
    """``_linger_first`` on the real engine, other replies' distances set by hand (8 codes of reach,
    a 50 ms bound): 9 codes away is too far; 3 codes away waits out the bound when that window never
    comes; a second ready window goes at once and takes the waiting one with it."""
    engine = speech_engine.engine
    saved = (engine.first_linger_codes, engine.first_linger_s)
    engine.first_linger_codes, engine.first_linger_s = 8, 0.05

    async def timed(rid: str) -> float:
        began = time.monotonic()
        await asyncio.wait_for(engine._linger_first(rid), 5)  # a wait without its bound fails, not hangs
        return time.monotonic() - began

    async def rules() -> tuple[float, float, float, float, int]:
        counted = engine.stats().lingered_first_windows
        engine._first_window_need["far"] = 9
        too_far = await timed("me")
        engine._first_window_need["near"] = 3
        bound = await timed("me")
        waiting = asyncio.ensure_future(timed("a"))
        await asyncio.sleep(0.01)
        assert engine._first_window_waiters, "the first ready window does not wait"
        company = await timed("b")  # another waits already: this one goes, and releases it
        released = await waiting
        return too_far, bound, company, released, engine.stats().lingered_first_windows - counted

    try:
        too_far, bound, company, released, counted = speech_engine.run(rules())
    finally:
        engine._first_window_need.clear()
        engine.first_linger_codes, engine.first_linger_s = saved
    assert too_far < 0.01
    assert 0.05 <= bound < 0.5
    assert company < 0.01 and 0.01 <= released < 0.04  # released at b's go, not at its 50 ms bound
    assert counted == 2  # the bound's wait and a's


def test_a_reply_keeps_its_distance_to_its_first_window_current(speech_engine: Harness) -> None:
    """The codes a reply still needs before its first window is cut are updated as its codes come
    (what other first windows measure their reach by), and the entry goes once it is cut."""
    engine = speech_engine.engine
    family = dict(engine.adapter.codec_windows)
    first = 40
    seen: list[int] = []

    async def watch() -> None:
        reply = request(max_tokens=60, want_audio=True, talker_tokens=2 * first)
        events = asyncio.ensure_future(_collect(engine.generate(reply)))
        while not events.done():
            need = engine._first_window_need.get(reply.request_id)
            if need is not None and (not seen or seen[-1] != need):
                seen.append(need)
            await asyncio.sleep(0.0005)
        assert reply.request_id not in engine._first_window_need
        await events

    engine.adapter.codec_windows = {**family, "first_chunk": first, "busy_streams": 99}
    try:
        speech_engine.run(watch())
    finally:
        engine.adapter.codec_windows = family
    assert len(seen) >= 3, seen  # it moved while the reply's codes came
    assert seen == sorted(seen, reverse=True) and seen[0] <= first + 5 and seen[-1] < seen[0]


async def _collect(events) -> list:
    return [event async for event in events]


async def _drain(events) -> None:
    async for _ in events:
        pass


@contextlib.contextmanager
def eager_to_end(runner) -> Iterator[None]:
    """The real talker with its end codes' logits raised far above the rest before each draw: a
    reply ends at its first code unless its end codes are suppressed."""
    sampler = runner.sampler
    eos = list(runner.codec_eos_ids)
    originals = {
        name: getattr(sampler, name) for name in ("sample", "sample_dense") if hasattr(sampler, name)
    }

    def biased(original):
        def draw(logits, *args, **kwargs):
            logits = logits.clone()
            logits[:, eos] = logits.max() + 1e4
            return original(logits, *args, **kwargs)

        return draw

    for name, original in originals.items():
        setattr(sampler, name, biased(original))
    try:
        yield
    finally:
        for name in originals:
            delattr(sampler, name)  # the class's methods again


def test_talker_ignore_eos_speaks_exactly_its_budget(family_speech_engine: Harness) -> None:
    """stage_params.talker.ignore_eos: the runner draws with its end codes suppressed at every
    step, and the cap a short text puts on the codes does not apply, so every reply speaks its
    whole talker budget: a benchmark's equal work."""
    budget = 104  # past the cap of 100 + 0 codes a text token set below
    runner = family_speech_engine.engine.stages.local.talker.runner

    def spoken(seed: int, *, ignore_eos: bool) -> float:
        base = request(max_tokens=8, temperature=1.0, seed=seed, want_audio=True, talker_tokens=budget)
        talker = {"max_tokens": budget, "codes_per_text_token": 0, "ignore_eos": ignore_eos}
        return finished(
            family_speech_engine.collect(replace(base, stage_params={"talker": talker}))
        ).usage.audio_seconds

    with admissions(runner) as admitted, eager_to_end(runner):
        free = spoken(3, ignore_eos=False)
        fixed = [spoken(seed, ignore_eos=True) for seed in (3, 4)]
    eos = set(runner.codec_eos_ids)
    assert [eos <= set(row.sampling.suppress_tokens) for row in admitted] == [False, True, True]
    assert free == 0  # the end code came first
    # the whole budget: 104 codes (Qwen2.5, 0.02 s each) or frames (Qwen3, 0.08 s each, less its edge)
    engine = family_speech_engine.engine
    per_code = engine.stages.local.vocoder.samples_per_code / engine.adapter.output_sample_rate
    assert fixed[0] == pytest.approx(fixed[1]) and fixed[0] == pytest.approx(budget * per_code, rel=0.005)


@pytest.mark.parametrize(
    ("talker", "param", "words"),
    [
        ({"ignore_eos": "yes"}, "stage_params.talker.ignore_eos", "must be true or false, not 'yes'"),
        ({"max_tokens": 0}, "stage_params.talker.max_tokens", "must be a whole number >= 1, not 0"),
        ({"max_tokens": "many"}, "stage_params.talker.max_tokens", "must be a whole number >= 1, not 'many'"),
        ({"max_tokens": 2.5}, "stage_params.talker.max_tokens", "must be a whole number >= 1, not 2.5"),
        (
            {"codes_per_text_token": -1},
            "stage_params.talker.codes_per_text_token",
            "whole number >= 0, not -1",
        ),
        ({"temperature": "hot"}, "stage_params.talker.temperature", "must be a number >= 0.0, not 'hot'"),
        ({"temperature": -0.5}, "stage_params.talker.temperature", "must be a number >= 0.0, not -0.5"),
        (
            {"top_k": 2.5},
            "stage_params.talker.top_k",
            "must be a whole number >= 0 and <= 2147483647, not 2.5",
        ),
        ({"top_p": 0}, "stage_params.talker.top_p", "must be a number > 0.0 and <= 1.0, not 0"),
        ({"top_p": [0.5]}, "stage_params.talker.top_p", "must be a number > 0.0 and <= 1.0, not [0.5]"),
        ({"top_p": "nan"}, "stage_params.talker.top_p", "must be a number > 0.0 and <= 1.0, not 'nan'"),
        (
            {"repetition_penalty": None},
            "stage_params.talker.repetition_penalty",
            "must be a number > 0.0, not None",
        ),
        (
            {"repetition_penalty": True},
            "stage_params.talker.repetition_penalty",
            "must be a number > 0.0, not True",
        ),
    ],
)
def test_a_wrong_talker_setting_is_refused_before_any_stage_runs(
    speech_engine: Harness, talker: dict, param: str, words: str
) -> None:
    req = replace(request(want_audio=True), stage_params={"talker": talker})
    with pytest.raises(EngineError) as err:
        speech_engine.collect(req)
    assert err.value.param == param and words in str(err.value)
