"""The vocoder stage: batched windows equal single windows; window audio has the exact length."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from omni_runtime.contract.options import EngineOptions


@pytest.fixture(scope="module")
def vocoder(tiny_checkpoint: Path):
    from omni_runtime.models.registry import load_adapter

    adapter = load_adapter(
        EngineOptions(model_path=str(tiny_checkpoint), device="cpu"),
        hosted=frozenset({"talker", "talker_stream"}),
    )
    assert adapter.loaded.text is None, "a talker-only process loads no thinker"
    return adapter.vocoder()


def _item(
    codes: list[int], start: int, end: int, ctx_start: int, ctx_end: int, voice: str, seed: int
) -> dict:
    window = {"start": start, "end": end, "ctx_start": ctx_start, "ctx_end": ctx_end}
    return {"codes": codes, "window": window, "voice": voice, "seed": seed, "reusable": True}


def test_batched_windows_equal_single_windows(vocoder) -> None:
    rng = np.random.default_rng(0)
    codes = [int(c) for c in rng.integers(0, 1000, 80)]
    items = [
        _item(codes, 10, 50, 0, 55, "Chelsie", 1),
        _item(codes, 50, 70, 40, 75, "Ethan", 2),  # another size: its own batch
        _item(codes[5:], 10, 50, 0, 55, "Ethan", 3),
        _item(codes, 0, 0, 0, 0, "Chelsie", 4),  # empty window
    ]
    together = vocoder.synthesize_many(items)
    alone = [vocoder.synthesize_many([item])[0] for item in items]
    for a, b, item in zip(together, alone, items, strict=True):
        w = item["window"]
        assert len(a) == len(b) == (w["end"] - w["start"]) * vocoder.samples_per_code
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert not np.array_equal(together[0], together[2]), "different codes and voices give different audio"


@pytest.mark.parametrize("buckets", ["1,2,4,8,16", "1,2,3,4,6,8,12,16"])
def test_a_batch_padded_to_its_bucket_gives_each_window_its_own_audio(vocoder, buckets: str) -> None:
    """Five windows of one size run as one batch padded to the bucket that holds them (8 by
    default, 6 with finer buckets: ``OMNI_VOCODER_BUCKETS``); each keeps its own audio."""
    from omni_runtime.models.window_graphs import vocoder_buckets

    rng = np.random.default_rng(1)
    items = [
        _item([int(c) for c in rng.integers(0, 1000, 55)], 10, 50, 0, 55, "Chelsie", seed)
        for seed in range(5)
    ]
    saved = vocoder.graphs.buckets
    vocoder.graphs.buckets = vocoder_buckets(buckets)
    padded: list[int] = []
    inputs = vocoder.inputs
    vocoder.inputs = lambda rows: padded.append(len(rows)) or inputs(rows)
    try:
        together = vocoder.synthesize_many(items)
    finally:
        vocoder.graphs.buckets = saved
        del vocoder.inputs
    assert padded == [8 if buckets == "1,2,4,8,16" else 6]
    for a, item in zip(together, items, strict=True):
        np.testing.assert_allclose(a, vocoder.synthesize_many([item])[0], rtol=1e-4, atol=1e-6)


def test_window_audio_tiles_into_the_whole_length(vocoder) -> None:
    codes = list(range(100, 130))
    parts = [
        vocoder.synthesize(codes, start=0, end=10, ctx_start=0, ctx_end=15, voice="Chelsie", seed=5),
        vocoder.synthesize(codes, start=10, end=30, ctx_start=0, ctx_end=30, voice="Chelsie", seed=5),
    ]
    assert sum(len(p) for p in parts) == 30 * 480
    assert all(p.dtype == np.float32 for p in parts)


def test_windows_that_tile_an_utterance_match_one_window_over_it(vocoder) -> None:
    """Non-streaming speech synthesises the streaming windows instead of one window over every
    code (each window a cancellable call). A window's starting noise is its slice of the
    utterance's noise, so the tiling differs from the whole window only where a window's context
    is cut short: the length is exact, and on the tiny checkpoint (whose DiT looks no further
    than the windows' context) the audio is the same to float rounding. 60 dB (an error a
    thousandth of the signal) leaves room for rounding on other CPUs; on the 87 dB measured
    here a single wrong window would fall to about 10 dB, as noise from another seed does."""
    from omni_runtime.pipeline.segmenter import (
        CodecSegmenter,
        SegmenterConfig,
        widen_to_recurring,
        window_item,
    )

    rng = np.random.default_rng(1)
    codes = [int(c) for c in rng.integers(0, 1000, 300)]
    voice = next(iter(vocoder.speakers))
    whole = vocoder.synthesize(codes, start=0, end=300, ctx_start=0, ctx_end=300, voice=voice, seed=3)
    segmenter = CodecSegmenter(SegmenterConfig(at_end=True))
    sizes = segmenter.recurring_sizes()
    windows = [widen_to_recurring(w, sizes) for w in segmenter.push(len(codes), done=True)]
    assert len(windows) == 9
    tiled = np.concatenate(
        vocoder.synthesize_many([window_item(codes, w, voice=voice, seed=3, sizes=sizes) for w in windows])
    )
    assert tiled.shape == whole.shape == (300 * vocoder.samples_per_code,)
    snr_db = 10 * np.log10(np.sum(whole**2) / np.sum((whole - tiled) ** 2))
    assert snr_db > 60, f"tiled windows differ from the whole window: {snr_db:.1f} dB"


@pytest.mark.parametrize("stock", [False, True], ids=["fused-block", "transformers-block"])
def test_the_dit_samples_the_mel_transformers_sample_gives(vocoder, stock: bool) -> None:
    """The vocoder's ODE (its modulation table, fused q/k/v and GELU epilogue, or with
    ``stock_dit`` transformers' own block) against ``Qwen2_5OmniToken2WavDiTModel.sample`` itself,
    from the same starting noise: the same mel to float32 rounding."""
    import torch

    voice = next(iter(vocoder.speakers))
    cond, ref_mel = vocoder.speakers[voice]
    codes = [int(c) for c in np.random.default_rng(4).integers(0, 1000, 24)]
    code = torch.tensor([codes])
    torch.manual_seed(11)
    expected = vocoder.dit.sample(cond, ref_mel, code)  # draws its noise first, from the global RNG
    torch.manual_seed(11)
    noise = torch.randn([1, len(codes) * vocoder.repeats, vocoder.dit.mel_dim], dtype=ref_mel.dtype)
    window = {"start": 0, "end": len(codes), "ctx_start": 0, "ctx_end": len(codes)}
    inputs = vocoder.inputs([{"codes": codes, "window": window, "voice": voice, "seed": 0}])
    assert inputs["noise"].shape == noise.shape
    vocoder.stock_dit = stock
    try:
        with torch.inference_mode():
            mel = vocoder._dit_sample(**{**inputs, "noise": noise})
    finally:
        vocoder.stock_dit = False
    assert mel.shape == expected.shape == (1, vocoder.dit.mel_dim, len(codes) * vocoder.repeats)
    assert float(expected.abs().max()) > 0.1, "a mel worth comparing"
    torch.testing.assert_close(mel, expected, rtol=1e-4, atol=1e-4)
