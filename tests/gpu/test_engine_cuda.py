"""The engine on CUDA: CUDA-graph decode, batching, speech, and the full-size dummy 7B thinker.

Skipped without a CUDA GPU. Run on the GPU machine with ``pytest tests/gpu -q``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from omni_runtime.contract.adapter import RowSampling, ThinkerAdmission  # noqa: E402
from omni_runtime.contract.engine import (  # noqa: E402
    AudioChunk,
    ChatTurn,
    Finished,
    GenerationRequest,
    SamplingParams,
    TextDelta,
)
from omni_runtime.contract.options import EngineOptions  # noqa: E402
from omni_runtime.pipeline import build_engine  # noqa: E402

pytestmark = pytest.mark.gpu


class Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 900.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def _request(
    text: str, *, tokens: int, audio: bool = False, talker: int = 60, seed: int | None = None
) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"gpu-{time.monotonic_ns()}",
        turns=(ChatTurn(role="user", text=text),),
        sampling=SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, seed=seed),
        want_audio=audio,
        stage_params={"talker": {"max_tokens": talker}},
    )


async def _collect(engine, request: GenerationRequest) -> list:
    return [event async for event in engine.generate(request)]


def _ids(events: list) -> list[int]:
    return [t for e in events if isinstance(e, TextDelta) for t in e.token_ids]


@pytest.fixture(scope="module")
def loop():
    runner = Loop()
    yield runner
    runner.close()


@pytest.fixture(scope="module")
def tiny_checkpoint() -> Path:
    from omni_runtime.models.qwen2_5_omni.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint(progress=False)


@pytest.fixture(scope="module")
def tiny_cuda(loop: Loop, tiny_checkpoint: Path):
    engine = build_engine(
        EngineOptions(
            model_path=str(tiny_checkpoint),
            device="cuda",
            dtype="float32",
            pipeline="streaming-speech",
            max_batch_size=8,
            max_model_len=1024,
        )
    )
    loop.run(engine.start())
    yield engine
    loop.run(engine.stop())


def test_graph_decode_equals_eager_decode(tiny_cuda) -> None:
    adapter = tiny_cuda.adapter
    graphs = adapter.thinker_runner(slots=4, max_len=512)
    eager = adapter.thinker_runner(slots=4, max_len=512)
    eager.decoder.cuda_graphs = False
    prompt = adapter.preprocess(_request("Hello there", tokens=1))
    tp = adapter.aggregate(prompt, audio=None, image=None, video=None)
    outs = []
    for runner in (graphs, eager):
        rows = [ThinkerAdmission(slot=s, prompt=tp, sampling=RowSampling(temperature=0.0), want_vectors=False)
                for s in range(3)]  # fmt: skip
        tokens = [[t for t, _ in runner.admit(rows)]]
        for i in range(24):
            tokens.append(runner.step(3, vector_slots=[], max_length=len(tp.input_ids) + 1 + i).tokens)
        outs.append(tokens)
    assert outs[0] == outs[1]
    assert len(graphs.decoder._graphs) >= 1


@pytest.mark.parametrize(
    ("rows", "heads", "kv_heads", "dim", "length"),
    [(16, 28, 4, 128, 256), (16, 12, 2, 64, 512), (1, 32, 4, 128, 1024)],
    ids=["7B thinker, 16 rows", "7B talker, 16 rows", "Qwen3 thinker, one row"],
)
def test_packed_decode_attention_compiled_by_inductor_equals_repeated_heads(
    rows, heads, kv_heads, dim, length
) -> None:
    """bf16 rows of different lengths in a cache view, as the slot decoder's compiled layers run
    them: the split-key kernel (executor/decode_attention.py) against repeated heads in float32."""
    import torch.nn.functional as F

    from omni_runtime.executor import decode_attention

    groups = heads // kv_heads

    class Attention(torch.nn.Module):
        num_key_value_groups = groups

    g = torch.Generator(device="cuda").manual_seed(0)
    query = torch.randn(rows, heads, 1, dim, device="cuda", generator=g, dtype=torch.bfloat16)
    cache = torch.randn(
        2, rows + 1, kv_heads, length + 64, dim, device="cuda", generator=g, dtype=torch.bfloat16
    )
    key, value = cache[0, :rows, :, :length], cache[1, :rows, :, :length]  # strided views
    lengths = torch.randint(1, length + 1, (rows,), device="cuda", generator=g)
    mask = (torch.arange(length, device="cuda")[None, :] < lengths[:, None])[:, None, None, :]
    calls: list[int] = []
    original, kernel = decode_attention.split_key_attention, decode_attention.KERNEL
    decode_attention.split_key_attention = lambda *a: calls.append(1) or original(*a)  # type: ignore[assignment]
    decode_attention.KERNEL = "split"  # opt-in: OMNI_DECODE_KERNEL=split
    try:
        compiled = torch.compile(decode_attention.packed_decode_attention, dynamic=True)
        got, _ = compiled(Attention(), query, key, value, mask, scaling=dim**-0.5)
    finally:
        decode_attention.split_key_attention, decode_attention.KERNEL = original, kernel  # type: ignore[assignment]
    assert calls  # traced through the kernel's op, not SDPA
    k, v = (t.float().repeat_interleave(groups, dim=1) for t in (key, value))
    want = F.scaled_dot_product_attention(query.float(), k, v, attn_mask=mask, scale=dim**-0.5).transpose(
        1, 2
    )
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


def test_suffixes_after_several_kept_prefixes_prefill_as_one_batch(tiny_cuda) -> None:
    """Two sessions' kept KV (prefixes of different lengths) restored into new slots and their
    suffixes prefilled in one batch: every step's greedy tokens equal fresh full prefills'."""
    adapter = tiny_cuda.adapter
    runner = adapter.thinker_runner(slots=8, max_len=512)
    greedy = RowSampling(temperature=0.0)
    sessions = []
    for slot, (text, fed_count) in enumerate([("Hello there", 3), ("Tell me a much longer story please", 2)]):
        tp = adapter.aggregate(
            adapter.preprocess(_request(text, tokens=1)), audio=None, image=None, video=None
        )
        [(first, _)] = runner.admit([ThinkerAdmission(slot, tp, greedy, want_vectors=False)])
        fed = [first]
        for i in range(fed_count):
            fed.append(
                runner.step(slot + 1, vector_slots=[], max_length=len(tp.input_ids) + 2 + i).tokens[slot]
            )
        sessions.append((tp, fed[:fed_count]))
    rows, kept = [], []
    for s, (tp, fed) in enumerate(sessions):
        keep = runner.keep(slot=s, length=len(tp.input_ids) + len(fed), prompt=tp, vectors=None)
        more = adapter.aggregate(
            adapter.preprocess(_request(f"and then {s}", tokens=1)), audio=None, image=None, video=None
        )
        ids = [*tp.input_ids, *fed, *more.input_ids[-6:]]
        with torch.inference_mode():
            embeds = adapter.loaded.embed(torch.tensor(ids, device="cuda"))
        longer = type(tp)(
            input_ids=ids, embeds=embeds, positions=torch.arange(len(ids)).expand(3, -1), rope_delta=0
        )
        rows.append(
            ThinkerAdmission(
                2 + s, longer, greedy, False, prefix=keep, prefix_length=len(tp.input_ids) + len(fed)
            )
        )
        kept.append(keep)
    rows += [ThinkerAdmission(4 + s, row.prompt, greedy, False) for s, row in enumerate(rows)]
    batches: list[int] = []
    prefill_suffixes = runner._prefill_suffixes
    runner._prefill_suffixes = lambda all_rows, which, *rest: (
        batches.append(len(which)),
        prefill_suffixes(all_rows, which, *rest),
    )[1]
    firsts = [t for t, _ in runner.admit(rows)]  # kept rows first, then the fresh ones
    assert batches == [2] and [r.reused for r in rows[:2]] == [r.prefix_length for r in rows[:2]]
    assert firsts[:2] == firsts[2:], firsts
    longest = max(len(r.prompt.input_ids) for r in rows)
    steps = [runner.step(6, vector_slots=[], max_length=longest + 1 + i).tokens for i in range(8)]
    for step in steps:  # the kept rows (slots 2, 3) and the fresh ones (4, 5) agree
        assert step[2:4] == step[4:6], steps


def test_batched_greedy_equals_single_on_cuda(loop: Loop, tiny_cuda) -> None:
    alone = _ids(loop.run(_collect(tiny_cuda, _request("Tell me a story.", tokens=24))))

    async def together():
        others = [_collect(tiny_cuda, _request(f"Other prompt {i} " * (i + 1), tokens=30)) for i in range(5)]
        return await asyncio.gather(_collect(tiny_cuda, _request("Tell me a story.", tokens=24)), *others)

    results = loop.run(together())
    assert _ids(results[0]) == alone
    assert tiny_cuda.stats().max_running_batch > 1


def test_streaming_speech_on_cuda(loop: Loop, tiny_cuda) -> None:
    events = loop.run(_collect(tiny_cuda, _request("Speak.", tokens=200, audio=True, talker=80)))
    kinds = [type(e).__name__ for e in events]
    chunks = [e for e in events if isinstance(e, AudioChunk)]
    assert chunks and {c.sample_rate for c in chunks} == {24000}
    assert kinds.index("AudioChunk") < max(i for i, k in enumerate(kinds) if k == "TextDelta")
    assert sum(len(c.pcm) for c in chunks) % 480 == 0
    assert isinstance(events[-1], Finished)


def test_speech_with_prefill_graphs_equals_speech_without(loop: Loop, tiny_cuda) -> None:
    """Greedy replies, one and three at once, with the thinker's and talker's prefills as CUDA
    graphs (captured at start-up unless ``OMNI_PREFILL_GRAPHS=0``; here on the stage threads if
    not) and without: the same text and the same audio."""
    local = tiny_cuda.stages.local
    stages = (local.thinker, local.talker)
    texts = ["Speak.", "Tell me about the sea.", "Hello there, how are you?"]

    def replies() -> list[tuple[list[int], np.ndarray]]:
        async def one(text: str) -> tuple[list[int], np.ndarray]:
            # seeded: an unseeded reply's vocoder noise follows its request id, which differs
            events = await _collect(tiny_cuda, _request(text, tokens=24, audio=True, talker=60, seed=5))
            pcm = [e.pcm for e in events if isinstance(e, AudioChunk)]
            return _ids(events), np.concatenate(pcm)

        async def together() -> list[tuple[list[int], np.ndarray]]:
            return list(await asyncio.gather(*(one(t) for t in texts)))

        return [loop.run(one(t)) for t in texts] + loop.run(together())

    before = [(s.runner.decoder.prefill_graphs, s.runner.decoder.prefill_padded) for s in stages]

    def switch(on: bool) -> None:
        for stage in stages:
            decoder = stage.runner.decoder
            decoder.prefill_graphs = decoder.prefill_padded = on
            if on:
                loop.run(stage.thread.run(decoder.capture_prefills))

    try:
        switch(False)
        plain = replies()
        switch(True)
        assert all(s.runner.decoder.prefill_graphs for s in stages), "the start-up check turned them off"
        graphed = replies()
    finally:
        for stage, (graphs, padded) in zip(stages, before, strict=True):
            stage.runner.decoder.prefill_graphs, stage.runner.decoder.prefill_padded = graphs, padded
    for k, ((ids, pcm), (want_ids, want_pcm)) in enumerate(zip(graphed, plain, strict=True)):
        assert ids == want_ids, f"reply {k}: text"
        assert pcm.shape == want_pcm.shape and pcm.size > 0, f"reply {k}: {pcm.shape} vs {want_pcm.shape}"
        diff = np.abs(pcm - want_pcm).max() / np.abs(want_pcm).max()
        assert diff <= 1e-3, f"reply {k}: audio differs by {diff:.2g} of its peak"


def test_one_off_windows_replay_graphs_captured_at_start(tiny_cuda) -> None:
    """A short reply's window sizes were captured at start-up (through the shape-generic block):
    none runs eagerly, and a replay gives the audio the eager block gives."""
    vocoder = tiny_cuda.stages.local.vocoder
    voice = next(iter(vocoder.speakers))
    captured = len(vocoder.tail_graphs)
    before = vocoder.eager_calls

    def item(size: int) -> dict:
        window = {"start": 0, "end": size, "ctx_start": 0, "ctx_end": size}
        return {"codes": list(range(size)), "window": window, "voice": voice, "seed": 3, "reusable": False}

    sizes = (1, 7, 16, 33)
    replayed = [vocoder.synthesize_many([item(n)])[0] for n in sizes]
    assert vocoder.eager_calls == before and len(vocoder.tail_graphs) == captured >= len(sizes)
    vocoder.tail_graphs.enabled = False
    try:
        eager = [vocoder.synthesize_many([item(n)])[0] for n in sizes]
    finally:
        vocoder.tail_graphs.enabled = True
    for n, a, b in zip(sizes, replayed, eager, strict=True):
        assert a.shape == b.shape == (n * vocoder.samples_per_code,)
        assert float(abs(a - b).max()) < 1e-3, n


def test_the_vocoders_dit_block_speaks_as_transformers_block_does_on_cuda(tiny_cuda) -> None:
    """The vocoder's DiT block (the modulation table, one q/k/v GEMM, cuBLASLt's GELU epilogue,
    compiled, in a CUDA graph) against transformers' own block through the same graph path, in the
    DiT's bfloat16: the same audio to bfloat16 rounding, for a single window and a batch of four."""
    import numpy as np

    vocoder = tiny_cuda.stages.local.vocoder
    voice = next(iter(vocoder.speakers))
    codes = [int(c) for c in np.random.default_rng(5).integers(0, 1000, 15)]
    window = {"start": 0, "end": 10, "ctx_start": 0, "ctx_end": 15}
    items = [
        {"codes": codes, "window": window, "voice": voice, "seed": s, "reusable": True} for s in range(4)
    ]
    ours = [vocoder.synthesize_many(items[:1])[0], *vocoder.synthesize_many(items)]
    vocoder.stock_dit = True  # drops the captured graphs: the next calls capture this block's
    try:
        theirs = [vocoder.synthesize_many(items[:1])[0], *vocoder.synthesize_many(items)]
    finally:
        vocoder.stock_dit = False
    for a, b in zip(ours, theirs, strict=True):
        assert a.shape == b.shape == (10 * vocoder.samples_per_code,)
        snr = 10 * np.log10(np.sum(b**2) / max(float(np.sum((a - b) ** 2)), 1e-30))
        assert snr > 25, f"the vocoder's DiT block is {snr:.1f} dB from transformers' block"


@pytest.mark.parametrize("offset", [0, 20])
def test_prefill_graphs_equal_the_unpadded_prefill(tiny_cuda, offset: int) -> None:
    """A fresh prompt's prefill replays its bucket's CUDA graph (captured at start-up) and gives
    the unpadded prefill's logits, hidden states and cache entries; a slot outside it is untouched.
    With a kept prefix (``offset``): the suffixes' (rows, length, span) graph, captured at start-up
    (``OMNI_SUFFIX_GRAPHS``, on by default), against the unpadded suffix after the same prefixes."""
    decoder = tiny_cuda.stages.local.thinker.runner.decoder
    before = decoder.prefill_graphs, decoder.prefill_padded, decoder.suffix_graphs, decoder.suffix_padded
    decoder.prefill_graphs = decoder.prefill_padded = True  # as start-up leaves them (OMNI_PREFILL_GRAPHS)
    decoder.suffix_graphs = decoder.suffix_padded = bool(offset)
    with torch.inference_mode():
        assert decoder.capture_prefills() > 0
    torch.manual_seed(0)
    lengths, slots = [13, 6, 9], [2, 0, 5]
    hidden = decoder.out_hidden.shape[-1]
    embeds = torch.randn(3, 13, hidden, device="cuda")
    positions = (torch.arange(13, device="cuda") + offset).view(1, 1, -1).expand(3, 3, -1)
    outside = decoder.cache.keys[0][1].clone()
    outs = []
    with torch.inference_mode():
        if offset:  # the same kept prefixes for both suffixes, prefilled unpadded once
            decoder.prefill_padded = False
            decoder.prefill(
                slots=slots,
                embeds=torch.randn(3, offset, hidden, device="cuda"),
                positions=torch.arange(offset, device="cuda").view(1, 1, -1).expand(3, 3, -1),
                lengths=[offset] * 3,
                want_hidden=False,
            )
        captured = len(decoder._prefill_graphs)
        for padded in (False, True):
            decoder.prefill_padded = decoder.suffix_padded = padded
            logits, states = decoder.prefill(
                slots=slots,
                embeds=embeds,
                positions=positions,
                lengths=lengths,
                want_hidden=True,
                offsets=[offset] * 3 if offset else None,
            )
            keys = [
                decoder.cache.keys[-1][s, :, : offset + n].clone()
                for s, n in zip(slots, lengths, strict=True)
            ]
            outs.append((logits, states, keys))
    suffix_graphs = [shape for shape in decoder._prefill_graphs if len(shape) == 3]
    decoder.prefill_graphs, decoder.prefill_padded, decoder.suffix_graphs, decoder.suffix_padded = before
    if offset:  # the start-up grid holds this suffix's bucket
        assert (4, 32, 256) in suffix_graphs and len(suffix_graphs) == len(decoder.prefill_shapes.suffixes())
    assert len(decoder._prefill_graphs) == captured  # replayed, none captured on the way
    (want_logits, want_hidden, want_keys), (got_logits, got_hidden, got_keys) = outs
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-3, atol=1e-3)
    for k, n in enumerate(lengths):
        torch.testing.assert_close(got_hidden[k, :n], want_hidden[k, :n], rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(got_keys[k], want_keys[k], rtol=1e-3, atol=1e-3)
    assert torch.equal(decoder.cache.keys[0][1], outside)


def test_prefills_after_the_warm_up_compile_nothing(tiny_cuda) -> None:
    """Qwen2.5's dense layers: every prefill shape a request can bring was compiled at start-up."""
    from prefill_shapes import compiled_shapes  # tests/gpu, beside this file

    local = tiny_cuda.stages.local
    compiled = compiled_shapes(
        {"thinker": local.thinker.runner.decoder, "talker": local.talker.runner.decoder}
    )
    assert compiled == [], f"(stack, rows, length, kept prefix) compiled after start-up: {compiled}"


@pytest.fixture(scope="module")
def dummy_7b(loop: Loop, tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory):
    """The released 7B config at full size, random bf16 weights, text pipeline."""
    from omni_runtime.models.qwen2_5_omni.released import create_released_shape

    path = create_released_shape(tmp_path_factory.mktemp("qwen2.5-omni-7b-dummy"))
    engine = build_engine(
        EngineOptions(
            model_path=str(path),
            load_format="dummy",
            device="cuda",
            pipeline="speech",
            max_batch_size=16,
            max_model_len=4096,
        )
    )
    loop.run(engine.start())
    yield engine
    loop.run(engine.stop())
    torch.cuda.empty_cache()


def test_dummy_7b_text_and_batching(loop: Loop, dummy_7b) -> None:
    events = loop.run(_collect(dummy_7b, _request("Hello", tokens=64)))
    assert events[-1].usage.completion_tokens == 64

    async def burst():
        return await asyncio.gather(*(_collect(dummy_7b, _request(f"Q{i}", tokens=64)) for i in range(16)))

    start = time.perf_counter()
    results = loop.run(burst())
    elapsed = time.perf_counter() - start
    assert all(r[-1].usage.completion_tokens == 64 for r in results)
    assert dummy_7b.stats().max_running_batch >= 8
    print(
        f"16 x 64 tokens in {elapsed:.2f}s = {16 * 64 / elapsed:.0f} tok/s on {torch.cuda.get_device_name(0)}"
    )


def test_dummy_7b_decode_step_is_near_the_bandwidth_bound(dummy_7b) -> None:
    runner = dummy_7b.stages.local.thinker.runner
    prompt = dummy_7b.adapter.preprocess(_request("Hello", tokens=1))
    tp = dummy_7b.adapter.aggregate(prompt, audio=None, image=None, video=None)
    scheduler = dummy_7b.stages.local.thinker
    assert scheduler.running_count == 0
    row = ThinkerAdmission(slot=0, prompt=tp, sampling=RowSampling(temperature=0.0), want_vectors=False)

    def measure() -> float:
        runner.admit([row])
        for i in range(3):
            runner.step(1, vector_slots=[], max_length=len(tp.input_ids) + 1 + i)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(64):
            runner.step(1, vector_slots=[], max_length=len(tp.input_ids) + 4 + i)
        torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1000 / 64

    ms = scheduler.thread._pool.submit(measure).result()  # on the thinker's own thread, while idle
    print(f"batch-1 decode step: {ms:.2f} ms on {torch.cuda.get_device_name(0)}")
    assert ms < 15.0  # bandwidth bound ~4.5 ms on an H100; plain generate takes ~90 ms
