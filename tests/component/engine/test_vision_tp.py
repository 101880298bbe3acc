"""Image-encoder tensor parallelism on the CPU (gloo): two real processes encode what one encodes.

The tiny checkpoint's vision tower (16 heads, hidden 128, MLP 256) splits over 2 ranks. Rank 0 is
this test process, loaded as a dedicated image-encoder process is (it hosts only the image
encoder); the follower is the real ``tp_follower --role image_encoder`` process it spawns. Image,
video and mixed-batch embeddings (float32) must match the single-process tower to 1e-4; closing
the adapter must leave no follower behind; bad sizes are refused with the flag named.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_harness import image, request, video
from served_worker import alive

from omni_runtime.contract.engine import EngineError
from omni_runtime.contract.options import EngineOptions

HOSTED = frozenset({"image_encoder"})


def _adapter(checkpoint: Path, tp: int) -> Any:
    from omni_runtime.models.qwen2_5_omni.adapter import Qwen25OmniAdapter
    from omni_runtime.models.qwen2_5_omni.loader import load_model

    options = EngineOptions(model_path=str(checkpoint), device="cpu", image_encoder_tp_size=tp)
    loaded = load_model(options, path=checkpoint, hosted=HOSTED)
    return Qwen25OmniAdapter(loaded, options=options, hosted=HOSTED)


@pytest.fixture(scope="module")
def adapters(tiny_checkpoint: Path) -> Iterator[dict[int, Any]]:
    built = {1: _adapter(tiny_checkpoint, 1), 2: _adapter(tiny_checkpoint, 2)}
    yield built
    built[2].close_vision()


def _inputs(adapter: Any, *media: Any) -> dict[str, Any]:
    prompt = adapter.preprocess(request("Describe.", media=tuple(media)))
    out: dict[str, Any] = {}
    out.update(prompt.images or {})
    out.update(prompt.videos or {})
    return out


@pytest.mark.slow  # the follower process takes ~20 s to start on a shared 2-core box
def test_tp2_image_and_video_embeddings_match_tp1(adapters: dict[int, Any]) -> None:
    one, two = adapters[1], adapters[2]
    batch = [
        _inputs(one, image(64, 80, seed=1)),
        _inputs(one, video(frames=4, size=56, seed=2)),
        _inputs(one, image(56, 56, seed=3), video(frames=2, size=56, seed=4)),
    ]
    single = one.encode_vision(batch)
    split = two.encode_vision(batch)
    compared = 0
    for a, b in zip(single, split, strict=True):
        for kind in ("image", "video"):
            assert (a[kind] is None) == (b[kind] is None)
            if a[kind] is not None:
                assert a[kind].shape == b[kind].shape and a[kind].shape[1] == 128
                torch.testing.assert_close(b[kind], a[kind], rtol=1e-4, atol=1e-4)
                compared += 1
    assert compared == 4
    # The shard really is a shard: a different tower would not match the embeddings above anyway,
    # but the sizes say each rank holds half of every block.
    block = two.loaded.visual.blocks[0]
    assert block.attn.q.weight.shape == (64, 128) and block.attn.num_heads == 8
    assert block.mlp.down_proj.weight.shape == (128, 128)


@pytest.mark.slow  # the follower process takes ~20 s to start on a shared 2-core box
def test_shards_hold_their_slice(adapters: dict[int, Any]) -> None:
    from omni_runtime.executor.tensor_parallel import RowParallelLinear

    full = adapters[1].loaded.visual.blocks[1]
    shard = adapters[2].loaded.visual.blocks[1]
    torch.testing.assert_close(shard.attn.k.weight, full.attn.k.weight[:64])
    torch.testing.assert_close(shard.attn.v.bias, full.attn.v.bias[:64])
    assert isinstance(shard.attn.proj, RowParallelLinear)
    torch.testing.assert_close(shard.attn.proj.weight, full.attn.proj.weight[:, :64])
    torch.testing.assert_close(shard.attn.proj.bias, full.attn.proj.bias)  # added once, after the sum
    torch.testing.assert_close(shard.mlp.up_proj.weight, full.mlp.up_proj.weight[:128])
    # Replicated: patch embedding, norms and the merger.
    torch.testing.assert_close(
        adapters[2].loaded.visual.merger.mlp[0].weight, adapters[1].loaded.visual.merger.mlp[0].weight
    )
    torch.testing.assert_close(shard.norm1.weight, full.norm1.weight)


def test_fused_qkv_split_keeps_q_k_v_aligned() -> None:
    """A fused q|k|v Linear (other Qwen vision towers) shards to the same rows as three Linears."""
    from omni_runtime.models.qwen2_5_omni.vision_tp import colwise_qkv_shard

    torch.manual_seed(0)
    fused = torch.nn.Linear(8, 3 * 8)
    q, k, v = fused.weight.detach().split(8)
    qb, kb, vb = fused.bias.detach().split(8)
    colwise_qkv_shard(fused, rank=1, world=2)
    assert fused.weight.shape == (12, 8) and fused.out_features == 12
    torch.testing.assert_close(fused.weight, torch.cat([q[4:], k[4:], v[4:]]))
    torch.testing.assert_close(fused.bias, torch.cat([qb[4:], kb[4:], vb[4:]]))


def test_bad_sizes_name_the_flag_and_the_choices(tiny_checkpoint: Path) -> None:
    from omni_runtime.models.qwen2_5_omni.loader import load_model, load_processor, released_7b_config
    from omni_runtime.models.qwen2_5_omni.vision_tp import check_vision_tp_size, valid_vision_tp_sizes

    vision_7b = released_7b_config(load_processor(None)).thinker_config.vision_config
    assert valid_vision_tp_sizes(vision_7b) == [1, 2, 4]  # 16 heads, MLP width 3420
    with pytest.raises(EngineError) as err:
        check_vision_tp_size(vision_7b, 3)
    assert str(err.value) == (
        "--image-encoder-tp-size 3 does not divide the vision tower's 16 heads (MLP width 3420); use 1, 2 or 4"
    )
    assert err.value.param == "image_encoder_tp_size"
    for hosted in (HOSTED, frozenset({"image_encoder", "mm_aggregate", "thinker"})):
        options = EngineOptions(model_path=str(tiny_checkpoint), device="cpu", image_encoder_tp_size=3)
        with pytest.raises(EngineError) as err:
            load_model(options, path=tiny_checkpoint, hosted=hosted)  # refused before any process starts
        assert str(err.value) == (
            "--image-encoder-tp-size 3 does not divide the vision tower's 16 heads (MLP width 256); "
            "use 1, 2, 4, 8 or 16"
        )


@pytest.mark.slow  # the follower process takes ~20 s to start on a shared 2-core box
def test_close_stops_the_follower(adapters: dict[int, Any]) -> None:
    """Runs last in this module: it closes the shared TP=2 tower."""
    leader = adapters[2].loaded.vision_tp
    pids = leader.pids
    assert len(pids) == 1 and alive(pids[0]) and pids[0] != os.getpid()
    adapters[2].close_vision()
    assert not alive(pids[0])
    adapters[2].close_vision()  # idempotent
