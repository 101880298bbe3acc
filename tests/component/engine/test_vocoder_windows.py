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


def test_window_audio_tiles_into_the_whole_length(vocoder) -> None:
    codes = list(range(100, 130))
    parts = [
        vocoder.synthesize(codes, start=0, end=10, ctx_start=0, ctx_end=15, voice="Chelsie", seed=5),
        vocoder.synthesize(codes, start=10, end=30, ctx_start=0, ctx_end=30, voice="Chelsie", seed=5),
    ]
    assert sum(len(p) for p in parts) == 30 * 480
    assert all(p.dtype == np.float32 for p in parts)
