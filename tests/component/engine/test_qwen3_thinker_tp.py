"""Qwen3-Omni-MoE thinker tensor parallelism on the CPU (gloo): two real processes answer as one.

The tiny Qwen3-Omni-MoE checkpoint (8 heads, 4 KV heads, 8 experts of 32 channels, top-2) splits
over 2 ranks: each rank keeps half of the attention heads and half of every expert's channels,
routes with the whole (replicated) router and all-reduces the experts' output. Rank 0 is the
engine in this process; the follower is the real ``omni_runtime.entrypoints.tp_follower`` process
it spawns (it picks the family from the checkpoint). Greedy text through the whole engine must
equal the single-process engine's for text, audio, image and video prompts: images and videos
also check that the vision tower's DeepStack features, computed on rank 0 only, reach the
follower's layers (tp_runner broadcasts them with the prefill).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from engine_harness import Harness, image, request, tiny_options, token_ids, tone, video
from served_worker import alive

from omni_runtime.contract.engine import EngineError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engines(qwen3_checkpoint: Path) -> Iterator[dict[int, Harness]]:
    one = Harness(tiny_options(qwen3_checkpoint, pipeline="text"))
    two = Harness(tiny_options(qwen3_checkpoint, pipeline="text", thinker_tp_size=2))
    yield {1: one, 2: two}
    one.close()
    if two.engine.adapter.loaded.tp.connected:  # the last test closes it
        two.close()


@pytest.mark.parametrize(
    "media",
    [(), (tone(0.6),), (image(),), (video(),), (tone(0.4), image(seed=3), video(seed=1))],
    ids=["text", "audio", "image", "video", "audio-image-video"],
)
def test_tp2_greedy_text_equals_tp1(engines: dict[int, Harness], media) -> None:
    req = request("What is this?", max_tokens=12, media=media, ignore_eos=False)
    tp1 = token_ids(engines[1].collect(req))
    tp2 = token_ids(engines[2].collect(req))
    assert len(tp1) > 0
    assert tp2 == tp1


def test_every_rank_keeps_half_of_each_expert_and_the_whole_router(engines: dict[int, Harness]) -> None:
    full = engines[1].engine.adapter.loaded.text.layers[0].mlp
    half = engines[2].engine.adapter.loaded.text.layers[0].mlp
    assert half.experts.gate_up_proj.shape == (8, 32, 128)  # [E, 2 * 32 / 2, H]
    assert half.experts.down_proj.shape == (8, 128, 16)
    torch.testing.assert_close(half.experts.gate_up_proj[:, :16], full.experts.gate_up_proj[:, :16])
    torch.testing.assert_close(half.experts.gate_up_proj[:, 16:], full.experts.gate_up_proj[:, 32:48])
    torch.testing.assert_close(half.experts.down_proj, full.experts.down_proj[:, :, :16])
    torch.testing.assert_close(half.gate.weight, full.gate.weight)
    attn = engines[2].engine.adapter.loaded.text.layers[0].self_attn
    assert attn.q_proj.weight.shape[0] == 4 * 16 and attn.k_proj.weight.shape[0] == 2 * 16


def test_a_tp_size_that_does_not_split_the_experts_names_the_flag(qwen3_checkpoint: Path) -> None:
    from omni_runtime.models.registry import load_adapter

    options = tiny_options(qwen3_checkpoint, pipeline="text", thinker_tp_size=3)
    with pytest.raises(EngineError) as err:
        load_adapter(options, hosted=frozenset({"thinker"}))
    assert err.value.param == "thinker_tp_size"
    assert "--thinker-tp-size 3" in str(err.value) and "use 1, 2 or 4" in str(err.value)


def test_closing_the_engine_stops_the_follower(engines: dict[int, Harness]) -> None:
    """Runs last in this module: it closes the shared TP=2 engine (a process leads one TP group)."""
    harness = engines[2]
    pids = harness.engine.adapter.loaded.tp.pids
    assert len(pids) == 1 and alive(pids[0])
    harness.close()
    assert not alive(pids[0])
