"""Qwen3-Omni-MoE through the staged pipeline computes what transformers' thinker ``generate`` does.

The tiny random-weight Qwen3-Omni-MoE checkpoint (MoE thinker with audio and vision towers) runs
through the real engine (text pipeline, CPU): greedy text with and without audio, images and video must equal
``Qwen3OmniMoeThinkerForConditionalGeneration.generate`` for the same processor inputs, which
checks the per-expert -> fused weight loading, the media scatter, the vision tower's DeepStack
features added after the first decoder layers, the interleaved mrope positions and the MoE layers
inside the runtime's slot KV cache. Speech output: test_qwen3_speech.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from engine_harness import (
    Harness,
    image,
    interleaved,
    request,
    tiny_options,
    token_ids,
    tone,
    video,
    video_with_soundtrack,
)


@pytest.fixture(scope="module")
def qwen3_text(qwen3_checkpoint: Path) -> Iterator[Harness]:
    harness = Harness(tiny_options(qwen3_checkpoint, pipeline="text"))
    yield harness
    harness.close()


@pytest.fixture(scope="module")
def hf_thinker(hf_qwen3):
    return hf_qwen3.thinker


@pytest.mark.parametrize(
    "media",
    [
        (),
        (tone(0.6),),
        (tone(1.7), tone(0.3)),
        (image(),),
        (video(),),
        (tone(0.4), image(seed=3), video(seed=1)),
    ],
    ids=["text", "audio", "two-audios", "image", "video", "audio-image-video"],
)
def test_greedy_text_equals_transformers_generate(qwen3_text: Harness, hf_thinker, media) -> None:
    req = request("What is this?", max_tokens=12, media=media, ignore_eos=False)
    ours = token_ids(qwen3_text.collect(req))
    prompt = qwen3_text.engine.adapter.preprocess(req)
    ids = torch.tensor([prompt.input_ids])
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    for part in (prompt.audio, prompt.images, prompt.videos):
        inputs.update(part or {})
    with torch.inference_mode():
        out = hf_thinker.generate(**inputs, max_new_tokens=12, do_sample=False)
    theirs = out[0, ids.shape[1] :].tolist()
    # The thinker's own generation config knows no EOS, so generate runs on: cut it at the first.
    eos = set(qwen3_text.engine.adapter.eos_token_ids)
    ends = [i for i, t in enumerate(theirs) if t in eos]
    assert len(ours) > 0
    assert ours == theirs[: ends[0] if ends else None]


@pytest.mark.parametrize(
    "media",
    [(video_with_soundtrack(),), (tone(0.5), video_with_soundtrack(seed=2), image(seed=1))],
    ids=["video-with-audio", "audio-video-with-audio-image"],
)
def test_audio_in_video_equals_transformers_generate(qwen3_text: Harness, hf_thinker, media) -> None:
    """use_audio_in_video: the soundtrack's tokens interleaved with the frames' by time, and
    get_rope_index told so, as ``generate(use_audio_in_video=True)`` does."""
    req = request("What is this?", max_tokens=12, media=media, ignore_eos=False)
    ours = token_ids(qwen3_text.collect(req))
    prompt = qwen3_text.engine.adapter.preprocess(req)
    assert prompt.audio_in_video and interleaved(qwen3_text.engine.adapter, prompt.input_ids)
    ids = torch.tensor([prompt.input_ids])
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    for part in (prompt.audio, prompt.images, prompt.videos):
        inputs.update(part or {})
    with torch.inference_mode():
        out = hf_thinker.generate(**inputs, use_audio_in_video=True, max_new_tokens=12, do_sample=False)
    theirs = out[0, ids.shape[1] :].tolist()
    eos = set(qwen3_text.engine.adapter.eos_token_ids)
    ends = [i for i, t in enumerate(theirs) if t in eos]
    assert len(ours) > 0
    assert ours == theirs[: ends[0] if ends else None]


def test_batched_rows_match_their_solo_runs(qwen3_text: Harness) -> None:
    """Rows decoded together (MoE routing per token, per-row cache) equal each row decoded alone."""
    prompts = ["Tell me a short story.", "Hello, how are you today?", "What is in this image?"]
    solo = [token_ids(qwen3_text.collect(request(p, max_tokens=10))) for p in prompts]

    async def together() -> list[list[int]]:
        import asyncio

        async def one(p: str) -> list[int]:
            return token_ids([e async for e in qwen3_text.engine.generate(request(p, max_tokens=10))])

        return list(await asyncio.gather(*(one(p) for p in prompts)))

    assert qwen3_text.run(together()) == solo


def test_the_moe_blocks_run_the_runtime_experts_kernel(qwen3_text: Harness) -> None:
    """No per-expert Python loop: every experts module of the served thinker uses the runtime's
    omni_fused (on CPU tensors it hands every call to grouped_mm) and every router the fused one;
    the reference above runs the per-expert loop, so the equalities cover both."""
    text = qwen3_text.engine.adapter.loaded.text
    experts = [m for m in text.modules() if hasattr(m, "_is_expert_parallel")]
    assert len(experts) == len(text.layers) == 2
    assert {m.config._experts_implementation for m in experts} == {"omni_fused"}
    assert {type(layer.mlp.gate).__name__ for layer in text.layers} == {
        "FusedQwen3OmniMoeThinkerTextTopKRouter"
    }


def test_dummy_load_format_builds_random_weights_of_the_checkpoint_shape(qwen3_checkpoint: Path) -> None:
    """--load-format dummy reads only config.json and the tokenizer (the released-shape directory
    of `omni tiny-checkpoint --shape released` has nothing else) and still serves."""
    harness = Harness(tiny_options(qwen3_checkpoint, pipeline="text", load_format="dummy"))
    try:
        tokens = token_ids(harness.collect(request("Hello there", max_tokens=5, media=(tone(0.3),))))
        assert len(tokens) == 5
        text = harness.engine.adapter.loaded.text
        loaded = hf_weights(qwen3_checkpoint)
        assert not torch.equal(text.embed_tokens.weight, loaded)  # random, not the checkpoint's
        # the one dummy table: what a lone mm_aggregate or a talker-only process draws too
        from omni_runtime.models.qwen2_5_omni.loader import dummy_embedding_rows

        weight = text.embed_tokens.weight
        rows = torch.tensor([0, 7, weight.shape[0] - 1])
        assert torch.equal(weight[rows], dummy_embedding_rows(rows, weight.shape[1]).to(weight.dtype))
    finally:
        harness.close()


def hf_weights(checkpoint: Path) -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        return f.get_tensor("thinker.model.embed_tokens.weight")


def test_fused_qkv_engine_gives_the_same_greedy_text(qwen3_checkpoint: Path, qwen3_text: Harness) -> None:
    """The loader fuses q/k/v on CUDA only; here the same fusion on CPU runs through the engine's
    slot decoder (prefill and batched decode, media prompts) and must not change a token."""
    from omni_runtime.models.qwen3_omni_moe.attention import fuse_qkv

    fused = Harness(tiny_options(qwen3_checkpoint, pipeline="text"))
    try:
        assert fuse_qkv(fused.engine.adapter.loaded.text) == 2
        for media in [(), (image(),), (tone(0.4), video(seed=1))]:
            req = request("What is this?", max_tokens=12, media=media, ignore_eos=False)
            assert token_ids(fused.collect(req)) == token_ids(qwen3_text.collect(req))
    finally:
        fused.close()
