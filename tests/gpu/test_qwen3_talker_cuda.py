"""Qwen3-Omni's talker on CUDA: the code predictor's frame as one CUDA graph equals the eager frame.

The tiny Qwen3 checkpoint in float32, streaming speech. The same seeded (and greedy) requests run
with the frame graphs and then with ``frame_graphs`` off (the same body, eagerly); frames and
audio must match, alone and with three rows sharing talker steps (a bucket above the rows, rows
whose draws do not count). Skipped without a CUDA GPU: ``pytest tests/gpu -q`` on the device.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from omni_runtime.contract.engine import AudioChunk, ChatTurn, GenerationRequest, SamplingParams  # noqa: E402
from omni_runtime.contract.options import EngineOptions  # noqa: E402
from omni_runtime.pipeline import build_engine  # noqa: E402

pytestmark = pytest.mark.gpu


def _started(dtype: str) -> Any:
    from omni_runtime.models.qwen3_omni_moe.tiny import ensure_tiny_checkpoint

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    built = build_engine(
        EngineOptions(
            model_path=str(ensure_tiny_checkpoint(progress=False)),
            device="cuda",
            dtype=dtype,
            pipeline="streaming-speech",
            max_batch_size=8,
            max_model_len=1024,
        )
    )

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(600)

    run(built.start())
    built.run = run  # type: ignore[attr-defined]
    yield built
    run(built.stop())
    loop.call_soon_threadsafe(loop.stop)


@pytest.fixture(scope="module")
def engine():
    yield from _started("float32")


@pytest.fixture(scope="module")
def engine_bf16():
    """The tiny checkpoint in bfloat16, as the released model runs: its MoE layers can be captured
    (in float32 transformers' grouped-GEMM fallback reads the expert offsets on the host, so the
    MoE stacks' decode and prefill graphs fail to capture and run eagerly)."""
    yield from _started("bfloat16")


def _speech(prompt: str, *, temperature: float) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"q3-gpu-{time.monotonic_ns()}",
        turns=(ChatTurn(role="user", text=prompt),),
        sampling=SamplingParams(max_tokens=12, temperature=temperature, seed=5, ignore_eos=True),
        want_audio=True,
        stage_params={"talker": {"max_tokens": 40}},
    )


def _audio(engine: Any, prompts: list[str], temperature: float) -> list[np.ndarray]:
    async def one(prompt: str) -> np.ndarray:
        events = [e async for e in engine.generate(_speech(prompt, temperature=temperature))]
        return np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)])

    async def together() -> list[np.ndarray]:
        return list(await asyncio.gather(*(one(p) for p in prompts)))

    return engine.run(together())


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_frame_graph_equals_the_eager_frame(engine: Any, temperature: float) -> None:
    runner = engine.stages.local.talker.runner
    assert runner.frame_graphs and runner._frame_graphs  # captured at warm-up
    prompts = ["Tell me a short story.", "Hello, how are you today?", "What is the weather like?"]
    graphed = [_audio(engine, [p], temperature)[0] for p in prompts] + _audio(engine, prompts, temperature)
    runner.frame_graphs = False
    try:
        eager = [_audio(engine, [p], temperature)[0] for p in prompts] + _audio(engine, prompts, temperature)
    finally:
        runner.frame_graphs = True
    for mine, reference in zip(graphed, eager, strict=True):
        assert mine.shape == reference.shape and mine.size > 0
        assert np.abs(mine - reference).max() <= 1e-4 * np.abs(reference).max()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_prefill_of_a_reply_replays_a_graph_equal_to_the_unpadded_prefill(
    engine_bf16: Any, temperature: float
) -> None:
    """Prefill graphs are on by default (``OMNI_PREFILL_GRAPHS=0`` turns them off): captured at
    start-up and passed the start-up check for both MoE stacks. Replies, one and three at once,
    with every padded prefill shadowed by the unpadded one on the same slots: each differs by no
    more than bfloat16 rounding (the start-up check's tolerance) and draws the same argmax."""
    from prefill_shapes import shadow_padded_prefills  # tests/gpu, beside this file

    local = engine_bf16.stages.local
    decoders = {"thinker": local.thinker.runner.decoder, "talker": local.talker.runner.decoder}
    for name, decoder in decoders.items():
        assert decoder.prefill_graphs and decoder._prefill_graphs, f"{name}: no prefill graphs"
    log: list[dict[str, Any]] = []
    originals = {name: shadow_padded_prefills(d, name, log) for name, d in decoders.items()}
    prompts = ["Tell me a short story.", "Hello, how are you today?", "What is the weather like?"]
    try:
        replies = [_audio(engine_bf16, [p], temperature)[0] for p in prompts]
        replies += _audio(engine_bf16, prompts, temperature)
    finally:
        for name, decoder in decoders.items():
            decoder.prefill = originals[name]
    assert all(r.size > 0 for r in replies)
    assert {e["stack"] for e in log} == {"thinker", "talker"}
    tolerance = decoders["thinker"].PREFILL_CHECK_TOLERANCE
    for entry in log:
        worst = max(v for k, v in entry.items() if k in ("logits", "hidden", "kept"))
        assert worst <= tolerance and entry["argmax same"], entry


@pytest.mark.parametrize("stage", ["thinker", "talker"])
@pytest.mark.parametrize(("rows", "length", "offset"), [(1, 7, 0), (1, 33, 0), (3, 21, 0), (1, 5, 12)])
def test_compiled_prefill_equals_the_eager_prefill(
    engine: Any, stage: str, rows: int, length: int, offset: int
) -> None:
    """The slot decoder's prefill through the compiled layers (warmed at start) against the same
    layers eagerly, on scratch slots of the idle engine: logits and hidden states, fresh prompts
    and a suffix after a kept prefix."""
    decoder = getattr(engine.stages.local, stage).runner.decoder
    assert decoder.compile_prefill and decoder.prefill_layers is decoder.step_layers
    generator = torch.Generator(device="cuda").manual_seed(rows * 100 + length)
    hidden = decoder.out_hidden.shape[-1]
    slots = list(range(decoder.slots - rows, decoder.slots))  # the last slots: no request uses them
    embeds = torch.randn(rows, length, hidden, device="cuda", generator=generator, dtype=decoder.dtype)
    positions = (torch.arange(length, device="cuda") + offset).view(1, 1, -1).expand(3, rows, -1)
    if offset:
        prefix = torch.randn(1, offset, hidden, device="cuda", generator=generator, dtype=decoder.dtype)
        before = torch.arange(offset, device="cuda").view(1, 1, -1).expand(3, 1, -1)
        decoder.prefill(slots=slots, embeds=prefix, positions=before, lengths=[offset], want_hidden=False)
    outs = []
    # The compiled layers unpadded, then the eager ones (float32: the MoE stacks' prefill graphs
    # cannot be captured; the bfloat16 engine's test above covers them).
    for layers in (decoder.step_layers, list(decoder.layers)):
        decoder.prefill_layers = layers
        try:
            logits, states = decoder.prefill(
                slots=slots,
                embeds=embeds,
                positions=positions,
                lengths=[length] * rows,
                want_hidden=True,
                offsets=[offset] * rows,
            )
        finally:
            decoder.prefill_layers = decoder.step_layers
        outs.append((logits.clone(), states.clone()))
    eager_logits, eager_states = outs[-1]
    for logits, states in outs[:-1]:
        assert torch.equal(logits.argmax(-1), eager_logits.argmax(-1))
        assert torch.allclose(logits, eager_logits, rtol=1e-3, atol=1e-3 * eager_logits.abs().max().item())
        assert torch.allclose(states, eager_states, rtol=1e-3, atol=1e-3 * eager_states.abs().max().item())


@pytest.mark.parametrize("streams", [1, 3, 16])
def test_code2wav_window_graphs_equal_eager_windows(engine: Any, streams: int) -> None:
    """Every recurring window size was captured at warm-up (a graph per batch bucket); a stream's
    windows through them (3 streams: a bucket of 4, one padding row) equal the same windows run
    eagerly (to TF32's precision), and only the one-off last window runs eagerly."""
    from dataclasses import asdict

    from omni_runtime.pipeline.segmenter import CodecSegmenter, family_config

    vocoder = engine.stages.local.vocoder
    segmenter_config = family_config(engine.adapter.codec_windows)
    sizes = CodecSegmenter(segmenter_config).recurring_sizes()
    assert vocoder.graphs.enabled and len(vocoder.graphs) == len(sizes) * 5
    generator = np.random.default_rng(streams)
    streams_frames = [
        [tuple(int(c) for c in row) for row in generator.integers(0, 2048, (90, vocoder.groups))]
        for _ in range(streams)
    ]
    cuts = CodecSegmenter(segmenter_config).push(90, done=True)
    items = [
        {
            "codes": frames,
            "window": asdict(w),
            "voice": "",
            "seed": 0,
            "reusable": w.ctx_end - w.ctx_start in sizes,
        }
        for w in cuts
        for frames in streams_frames
    ]
    before = vocoder.graphs.eager_calls
    graphed = vocoder.synthesize_many(items)
    one_offs = len({w.ctx_end - w.ctx_start for w in cuts} - sizes)
    assert vocoder.graphs.eager_calls - before == one_offs
    vocoder.graphs.enabled = False
    try:
        eager = vocoder.synthesize_many(items)
    finally:
        vocoder.graphs.enabled = True
    # cuDNN's float32 convolutions use TF32 (torch.backends.cudnn.allow_tf32 is on by default) and
    # may pick another algorithm inside a capture: 5e-4 of the peak was measured on an H200.
    for mine, reference in zip(graphed, eager, strict=True):
        assert mine.shape == reference.shape and mine.size > 0
        assert np.abs(mine - reference).max() <= 2e-3 * np.abs(reference).max()


def test_admission_prompts_queue_without_waiting_for_the_gpu(engine: Any) -> None:
    """The per-row work of an admission (the talker's prompt, the thinker's prompt vectors) is
    only queued: under ``set_sync_debug_mode("error")`` a host sync would raise. The rows are the
    ones a real request admitted, rebuilt on the idle engine."""
    talker = engine.stages.local.talker.runner
    thinker = engine.stages.local.thinker.runner
    admitted: list[Any] = []
    original = talker.admit

    def keep(rows: list[Any]) -> Any:
        admitted.extend(rows)
        return original(rows)

    talker.admit = keep
    try:
        _audio(engine, ["Hello there, how are you?"], 0.0)
    finally:
        del talker.admit
    row = admitted[0]
    ids = list(row.input_ids)
    embeds = torch.zeros(
        len(ids), row.prompt_vectors.shape[-1], device="cuda", dtype=row.prompt_vectors.dtype
    )
    thinker.decoder.kept_hidden = None  # the last prefill's accept layer: these vectors read ``embeds``
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.inference_mode():
            prompt = talker._prompt(row)
            vectors = thinker.prompt_vectors(0, ids, embeds, embeds)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert prompt.shape[0] > len(ids) // 2 and vectors.shape == embeds.shape


def test_prefills_after_the_warm_up_compile_nothing(engine: Any) -> None:
    """Every prefill shape a request can bring was compiled at start-up (``prefill_shapes``)."""
    from prefill_shapes import compiled_shapes  # tests/gpu, beside this file

    local = engine.stages.local
    compiled = compiled_shapes(
        {"thinker": local.thinker.runner.decoder, "talker": local.talker.runner.decoder}
    )
    assert compiled == [], f"(stack, rows, length, kept prefix) compiled after start-up: {compiled}"


def _turns(engine: Any, turns: list[ChatTurn], session: str | None) -> tuple[str, np.ndarray]:
    """One greedy speech reply to ``turns``: its text and its audio."""
    from omni_runtime.contract.engine import TextDelta

    request = GenerationRequest(
        request_id=f"q3-kv-{time.monotonic_ns()}",
        turns=tuple(turns),
        sampling=SamplingParams(max_tokens=10, temperature=0.0, seed=5, ignore_eos=True),
        want_audio=True,
        stage_params={"talker": {"max_tokens": 30}},
        session_key=session,
    )

    async def collect() -> list[Any]:
        events = [e async for e in engine.generate(request)]
        while not engine.stages.local.quiet:  # the rows ended and their KV was kept
            await asyncio.sleep(0.01)
        return events

    events = engine.run(collect())
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    return text, np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_session_turn_restores_the_talkers_kept_kv(engine: Any, engine_bf16: Any, dtype: str) -> None:
    """The second speech turn of a session restores the talker's kept KV of the first turn's user
    positions and prefills only the rest (on CUDA: a suffix prefill with hidden states, then the
    frame graphs). In float32 its audio is the audio of the same conversation prefilled in full;
    in bfloat16 (the MoE stacks' prefill graphs) the kept prefix is counted and the reply has
    the full prefill's length."""
    built = engine if dtype == "float32" else engine_bf16
    kv = built.stages.local.talker.kv
    session = f"q3-gpu-kv-{dtype}"
    turns = [ChatTurn(role="user", text="Say hello to me, please.")]
    said, _ = _turns(built, turns, session)
    turns += [ChatTurn(role="assistant", text=said), ChatTurn(role="user", text="Once more, louder.")]
    before = kv.counters()
    _, kept = _turns(built, turns, session)
    after = kv.counters()
    _, full = _turns(built, turns, None)
    built.end_session(session)
    assert after.hits - before.hits == 1 and after.reused_tokens > before.reused_tokens
    assert kept.shape == full.shape and kept.size > 0 and np.isfinite(kept).all()
    if dtype == "float32":
        assert np.abs(kept - full).max() <= 1e-3 * np.abs(full).max()
