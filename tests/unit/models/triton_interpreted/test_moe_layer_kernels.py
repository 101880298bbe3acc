"""The fused MoE decode layer (executor.moe_layer) run by Triton's interpreter on CPU tensors,
against transformers' own Qwen3-Omni thinker decoder layer (SDPA attention, the eager experts
loop) on the same weights, slot cache and positions. Float32: the interpreter's bfloat16 ``tl.dot``
is not faithful (the GPU tests cover bfloat16). Collected only under TRITON_INTERPRET=1
(tests/unit/models/test_moe_decode.py starts that pytest)."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import Qwen3OmniMoeConfig
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf

from omni_runtime.executor import moe_decode, moe_layer
from omni_runtime.executor.slot_cache import SlotKVCache
from omni_runtime.models.qwen3_omni_moe.attention import fuse_qkv
from omni_runtime.models.qwen3_omni_moe.decode_layer import fused_decode_layers

assert os.environ.get("TRITON_INTERPRET") == "1", "run under TRITON_INTERPRET=1 (see the docstring)"

KV_HEADS, HEAD_DIM, HIDDEN = 4, 16, 128


def stack(dtype: torch.dtype = torch.float32):
    text = Qwen3OmniMoeConfig().thinker_config.text_config
    text.hidden_size, text.num_attention_heads = HIDDEN, 8
    text.num_key_value_heads, text.head_dim = KV_HEADS, HEAD_DIM
    text.num_experts, text.num_experts_per_tok, text.moe_intermediate_size = 8, 2, 32
    text._experts_implementation, text._attn_implementation = "eager", "sdpa"
    layers = torch.nn.ModuleList([hf.Qwen3OmniMoeThinkerTextDecoderLayer(text, 0)]).to(dtype)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in layers.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1 + 0.1 * noise if "norm" in name else noise / param.shape[-1] ** 0.5)
    fuse_qkv(layers)
    return text, layers, hf.Qwen3OmniMoeThinkerTextRotaryEmbedding(text)


def slot_cache(write: torch.Tensor, view: int, dtype: torch.dtype) -> SlotKVCache:
    cache = SlotKVCache(
        layers=1, slots=4, kv_heads=KV_HEADS, max_len=view, head_dim=HEAD_DIM, dtype=dtype, device="cpu"
    )
    generator = torch.Generator().manual_seed(1)
    cache.keys[0].copy_(torch.randn(cache.keys[0].shape, generator=generator))
    cache.values[0].copy_(torch.randn(cache.values[0].shape, generator=generator))
    cache.write_pos, cache.view_len = write, view
    cache.layer_keys, cache.layer_values = cache.keys[0], cache.values[0]
    return cache


def step_inputs(rotary, write: list[int], view: int, dtype: torch.dtype):
    at = torch.tensor(write)
    hidden = torch.randn(len(write), 1, HIDDEN, generator=torch.Generator().manual_seed(2)).to(dtype)
    cos_sin = rotary(hidden, (at + 3).view(1, -1, 1).expand(3, -1, 1))
    mask = (torch.arange(view)[None, :] <= at[:, None])[:, None, None, :]
    return at, hidden, cos_sin, mask


@pytest.mark.parametrize(
    ("write", "view"),
    [
        ([5], 64),  # one split
        ([0], 64),  # no cached key: the new one alone
        ([300], 512),  # several splits combined by the last
        ([5, 17, 40], 64),  # three rows (padded to four)
        ([0, 511, 64, 63], 512),  # four rows, split edges
    ],
)
def test_fused_layer_equals_transformers_layer(write, view) -> None:
    _, layers, rotary = stack()
    at, hidden, cos_sin, mask = step_inputs(rotary, write, view, torch.float32)
    expected_cache, got_cache = slot_cache(at, view, torch.float32), slot_cache(at, view, torch.float32)
    fused = fused_decode_layers(layers, list(layers), "fused")
    assert fused is not None
    with torch.no_grad():
        expected = layers[0](
            hidden, attention_mask=mask, position_embeddings=cos_sin, past_key_values=expected_cache
        )
        got = fused[0](hidden, attention_mask=mask, position_embeddings=cos_sin, past_key_values=got_cache)
    assert got.shape == expected.shape == (len(write), 1, HIDDEN)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # The new key and value went where transformers' cache update put them, nothing else moved.
    torch.testing.assert_close(got_cache.keys[0], expected_cache.keys[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_cache.values[0], expected_cache.values[0], rtol=1e-5, atol=1e-5)
    layer = fused[0]
    assert isinstance(layer, moe_layer.FusedMoeDecodeLayer)
    assert not layer.attention_count.any() and not layer.router_count.any()  # reset for the next step


def test_a_prefill_or_a_large_batch_goes_to_the_wrapped_layer() -> None:
    _, layers, rotary = stack()
    calls: list[tuple[int, ...]] = []

    def fallback(hidden, **kwargs):
        calls.append(tuple(hidden.shape))
        return layers[0](hidden, **kwargs)

    fused = fused_decode_layers(layers, [fallback], "fused")
    assert fused is not None
    rows = moe_layer.MAX_ROWS + 1
    write = list(range(3, 3 + rows))
    at, hidden, cos_sin, mask = step_inputs(rotary, write, 64, torch.float32)
    cache = SlotKVCache(
        layers=1,
        slots=rows,
        kv_heads=KV_HEADS,
        max_len=64,
        head_dim=HEAD_DIM,
        dtype=torch.float32,
        device="cpu",
    )
    cache.write_pos, cache.view_len = at, 64
    cache.layer_keys, cache.layer_values = cache.keys[0], cache.values[0]
    with torch.no_grad():
        fused[0](hidden, attention_mask=mask, position_embeddings=cos_sin, past_key_values=cache)
        cache.prefill_slots = torch.tensor([0])  # a prefill: the decoder sets its slots
        one = tuple(t[:1] for t in cos_sin)
        fused[0](hidden[:1], attention_mask=None, position_embeddings=one, past_key_values=cache)
    assert calls == [(rows, 1, HIDDEN), (1, 1, HIDDEN)]


def test_router_kernel_routes_as_transformers_in_bfloat16() -> None:
    """The norm, router logits and top-k in bfloat16 (no tl.dot): the same experts and weights."""
    _, layers, _ = stack(torch.bfloat16)
    fused = fused_decode_layers(layers, list(layers), "fused")
    assert fused is not None
    layer = fused[0]
    assert isinstance(layer, moe_layer.FusedMoeDecodeLayer)
    w = layer.weights
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    with torch.no_grad():
        normed_expected = layers[0].post_attention_layernorm(x)
        _, weights_expected, index_expected = layers[0].mlp.gate(normed_expected)
    normed = torch.empty_like(x)
    logits = torch.empty(3, 8, dtype=torch.float32)
    weights = torch.empty(3, 2, dtype=torch.bfloat16)
    index = torch.empty(3, 2, dtype=torch.int64)
    moe_layer._kernels().router_kernel[(4,)](
        x, w.post_norm, w.router, normed, logits, layer.router_count, weights, index,
        3, x.stride(0), normed.stride(0), w.eps,
        HIDDEN=HIDDEN, K_PAD=HIDDEN, EXPERTS=8, E_PAD=8, ROWS=4, BLOCK_E=2, PROGRAMS=4, TOP_K=2,
        NORMALIZE=True, PDL=False,
    )  # fmt: skip
    # Within a bfloat16 step or two: the interpreter's rounding to bfloat16 is not the GPU's.
    torch.testing.assert_close(normed, normed_expected, rtol=2e-2, atol=2e-2)
    assert torch.equal(index, index_expected)
    torch.testing.assert_close(weights, weights_expected, rtol=1e-2, atol=1e-2)
    assert layer.router_count.item() == 0


@pytest.mark.parametrize("seed", range(4))
def test_routing_equals_a_stable_sort_with_ties(seed: int) -> None:
    """``route_row`` (k rounds of argmax): the experts and renormalised weights of softmax and a stable
    descending sort, including exact ties (the lower index first; torch.topk leaves their order
    open) and a width below the lanes (padding)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randint(-3, 4, (5, 12), generator=generator).float()  # many ties
    weights, index = moe_decode.route(logits, 4, True)
    prob = torch.softmax(logits, dim=-1)
    top, expected = (t[:, :4] for t in torch.sort(prob, dim=-1, descending=True, stable=True))
    assert torch.equal(index, expected)
    torch.testing.assert_close(weights, top / top.sum(-1, keepdim=True))


@pytest.mark.parametrize(("write", "view"), [([0], 64), ([5], 64), ([300], 512), ([130], 512)])
def test_the_attention_outputs_agree(write, view) -> None:
    """``attention_kernel``'s outputs for one row: its last split merging one split a round (the
    reference), four a round, and (a view of one split) its one split writing the row: the same
    row, and the same new key and value in the cache."""
    _, layers, rotary = stack()
    fused = fused_decode_layers(layers, list(layers), "fused")
    assert fused is not None
    layer = fused[0]
    assert isinstance(layer, moe_layer.FusedMoeDecodeLayer)
    w, kernels = layer.weights, moe_layer._kernels()
    at, _, cos_sin, _ = step_inputs(rotary, write, view, torch.float32)
    cos, sin = (t.reshape(t.shape[0], -1)[:, -HEAD_DIM:] for t in cos_sin)
    qkv = torch.randn(1, w.qkv.shape[0], generator=torch.Generator().manual_seed(7))
    groups = w.heads // w.kv_heads
    splits, per_split = moe_layer.split_plan(1, KV_HEADS, view)
    outputs = [(kernels.OUTPUT_MERGED, 1), (kernels.OUTPUT_MERGED, 4)]
    if splits == 1:
        outputs.append((kernels.OUTPUT_DIRECT, 1))
    got = []
    for output, chunk in outputs:
        cache = slot_cache(at, view, torch.float32)
        m = torch.empty(KV_HEADS, splits, 16)
        denominators = torch.empty_like(m)
        partial = torch.empty(KV_HEADS, splits, 16, HEAD_DIM)
        attended = torch.zeros(1, w.heads * HEAD_DIM)
        keys, values = cache.layer_keys, cache.layer_values
        kernels.attention_kernel[(KV_HEADS, splits)](
            qkv, w.q_norm, w.k_norm, cos, sin, keys, values, at,
            m, denominators, partial, layer.attention_count, attended,
            qkv.stride(0), cos.stride(0), sin.stride(0), keys.stride(0), keys.stride(1), keys.stride(2),
            attended.stride(0), splits, per_split, w.scaling, w.qk_eps,
            KV_HEADS=KV_HEADS, GROUPS=groups, DIM=HEAD_DIM, BLOCK_G=16, BLOCK_N=moe_layer.BLOCK_N,
            PDL=False, OUTPUT=output, MERGE_CHUNK=chunk,
        )  # fmt: skip
        got.append((attended, cache.layer_keys.clone(), cache.layer_values.clone()))
    for other in got[1:]:
        for value, expected in zip(other, got[0], strict=True):
            torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-5)
    assert not layer.attention_count.any()
