"""The fused MoE decode layer (executor.moe_layer) compiled on a GPU, at the released
Qwen3-Omni-30B-A3B thinker's layer shape (hidden 2048, 32 query and 4 key/value heads of 128,
128 experts of 768, top-8), bfloat16: equal to transformers' layer (SDPA, grouped_mm experts) up
to bfloat16 rounding, the same with programmatic dependent launches, and replayed from a CUDA
graph exactly as run eagerly.

Skipped without a CUDA GPU. Run on the GPU machine with ``pytest tests/gpu -q``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf  # noqa: E402

from omni_runtime.executor import moe_layer, row_gemv  # noqa: E402
from omni_runtime.executor.slot_cache import SlotKVCache  # noqa: E402
from omni_runtime.models.qwen3_omni_moe.attention import fuse_qkv  # noqa: E402
from omni_runtime.models.qwen3_omni_moe.config import released_30b_a3b_config  # noqa: E402
from omni_runtime.models.qwen3_omni_moe.decode_layer import fused_decode_layers  # noqa: E402

pytestmark = pytest.mark.gpu
MAX_LEN = 1024


@pytest.fixture(scope="module")
def stack():
    text = released_30b_a3b_config().thinker_config.text_config
    text._experts_implementation = "grouped_mm"
    text._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        layers = torch.nn.ModuleList([hf.Qwen3OmniMoeThinkerTextDecoderLayer(text, 0)]).to(torch.bfloat16)
        with torch.no_grad():
            for name, param in layers.named_parameters():
                if "norm" in name:
                    param.copy_(1 + 0.1 * torch.randn_like(param))
                else:
                    param.copy_(torch.randn_like(param) / param.shape[-1] ** 0.5)
        rotary = hf.Qwen3OmniMoeThinkerTextRotaryEmbedding(text)
    fuse_qkv(layers)
    return text, layers, rotary


def _cache(text, write: torch.Tensor, view: int) -> SlotKVCache:
    cache = SlotKVCache(
        layers=1, slots=4, kv_heads=text.num_key_value_heads, max_len=MAX_LEN, head_dim=text.head_dim,
        dtype=torch.bfloat16, device="cuda",
    )  # fmt: skip
    generator = torch.Generator(device="cuda").manual_seed(1)
    cache.keys[0].copy_(torch.randn(cache.keys[0].shape, generator=generator, device="cuda"))
    cache.values[0].copy_(torch.randn(cache.values[0].shape, generator=generator, device="cuda"))
    cache.write_pos, cache.view_len = write, view
    cache.layer_keys, cache.layer_values = cache.keys[0], cache.values[0]
    return cache


def _inputs(text, rotary, write: list[int], view: int):
    rows = len(write)
    at = torch.tensor(write, device="cuda")
    hidden = torch.randn(rows, 1, text.hidden_size, device="cuda", dtype=torch.bfloat16)
    positions = (at + 2).view(1, rows, 1).expand(3, rows, 1)
    cos_sin = rotary(hidden, positions)
    mask = (torch.arange(view, device="cuda")[None, :] <= at[:, None])[:, None, None, :]
    return at, hidden, cos_sin, mask


@pytest.mark.parametrize(
    ("write", "view"),
    [
        ([100], 256),
        ([0], 256),
        ([700], 1024),
        ([5, 300], 512),
        ([3, 250, 511, 40], 512),
        ([40], 64),
        ([2, 60], 64),
    ],
)
@pytest.mark.parametrize("mode", ["fused", "pdl"])
def test_fused_layer_equals_transformers_layer(stack, write, view, mode) -> None:
    text, layers, rotary = stack
    at, hidden, cos_sin, mask = _inputs(text, rotary, write, view)
    expected_cache, got_cache = _cache(text, at, view), _cache(text, at, view)
    with torch.no_grad():
        expected = layers[0](
            hidden, attention_mask=mask, position_embeddings=cos_sin, past_key_values=expected_cache
        )
        fused = fused_decode_layers(layers, list(layers), mode)
        assert fused is not None
        got = fused[0](hidden, attention_mask=mask, position_embeddings=cos_sin, past_key_values=got_cache)
    torch.cuda.synchronize()
    scale = expected.float().abs().max().item()
    assert (got.float() - expected.float()).abs().max().item() <= 3e-2 * scale
    for name in ("keys", "values"):
        mine, theirs = getattr(got_cache, name)[0], getattr(expected_cache, name)[0]
        assert (mine.float() - theirs.float()).abs().max().item() <= 3e-2 * theirs.float().abs().max().item()
    assert not fused[0].attention_count.any() and not fused[0].router_count.any()


@pytest.mark.parametrize("mode", ["fused", "pdl"])
def test_fused_layer_replays_from_a_cuda_graph(stack, mode) -> None:
    text, layers, rotary = stack
    at, hidden, cos_sin, mask = _inputs(text, rotary, [17, 400], 512)
    fused = fused_decode_layers(layers, list(layers), mode)
    assert fused is not None
    cache = _cache(text, at, 512)
    with torch.no_grad():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fused[0](hidden, attention_mask=mask, position_embeddings=cos_sin, past_key_values=cache)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = fused[0](
                hidden, attention_mask=mask, position_embeddings=cos_sin, past_key_values=cache
            )
        fresh = torch.randn_like(hidden)
        hidden.copy_(fresh)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        eager = fused[0](fresh, attention_mask=mask, position_embeddings=cos_sin, past_key_values=cache)
    torch.testing.assert_close(static_out, eager, rtol=0, atol=0)


def _run(layer, hidden, cos_sin, mask, cache):
    with torch.no_grad():
        return layer(hidden, attention_mask=mask, position_embeddings=cos_sin, past_key_values=cache)


@pytest.mark.parametrize(("write", "view"), [([100], 256), ([0], 256), ([700], 1024)])
def test_one_row_moe_kernel_equals_the_triton_kernels(stack, write, view) -> None:
    text, layers, rotary = stack
    at, hidden, cos_sin, mask = _inputs(text, rotary, write, view)
    fused = fused_decode_layers(layers, list(layers), "pdl")
    assert fused is not None
    assert fused[0].row is not None, "an H100/H200 takes the one-kernel MoE block at this shape"
    got = _run(fused[0], hidden, cos_sin, mask, _cache(text, at, view))
    row = fused[0].row
    fused[0].row = None  # the router, gate-up and down Triton kernels
    expected = _run(fused[0], hidden, cos_sin, mask, _cache(text, at, view))
    torch.cuda.synchronize()
    scale = expected.float().abs().max().item()
    assert (got.float() - expected.float()).abs().max().item() <= 1e-2 * scale
    assert sorted(row.route_index.tolist()) == sorted(set(row.route_index.tolist()))  # 8 distinct experts
    # Run again: the grid barrier's counter carries over between calls.
    fused[0].row = row
    again = _run(fused[0], hidden, cos_sin, mask, _cache(text, at, view))
    torch.testing.assert_close(again, got, rtol=0, atol=0)


def test_one_row_moe_kernel_replays_from_a_cuda_graph(stack) -> None:
    text, layers, rotary = stack
    at, hidden, cos_sin, mask = _inputs(text, rotary, [17], 512)
    fused = fused_decode_layers(layers, list(layers), "pdl")
    assert fused is not None and fused[0].row is not None
    cache = _cache(text, at, 512)
    with torch.no_grad():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            _run(fused[0], hidden, cos_sin, mask, cache)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = _run(fused[0], hidden, cos_sin, mask, cache)
        fresh = torch.randn_like(hidden)
        hidden.copy_(fresh)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        eager = _run(fused[0], fresh, cos_sin, mask, cache)
    torch.testing.assert_close(static_out, eager, rtol=0, atol=0)


def test_one_row_routing_is_softmax_and_a_stable_top_k_of_its_logits(stack) -> None:
    """The kernel's routing of the logits its blocks published (bfloat16 values in the low 32 bits):
    exactly the experts of a stable descending sort of their softmax, and the weights renormalised
    over the k and rounded to bfloat16 within a bfloat16 step; over 16 rows."""
    text, layers, rotary = stack
    fused = fused_decode_layers(layers, list(layers), "pdl")
    assert fused is not None and fused[0].row is not None
    row = fused[0].row
    for seed in range(16):
        torch.manual_seed(200 + seed)
        at, hidden, cos_sin, mask = _inputs(text, rotary, [seed * 11], 512)
        _run(fused[0], hidden, cos_sin, mask, _cache(text, at, 512))
        torch.cuda.synchronize()
        logits = (row.logits & 0xFFFFFFFF).to(torch.int32).view(torch.float32)
        prob = torch.softmax(logits, dim=-1)
        top, index = (t[: text.num_experts_per_tok] for t in torch.sort(prob, descending=True, stable=True))
        assert row.route_index.tolist() == index.tolist()
        expected = (top / top.sum()).to(torch.bfloat16)  # within a bfloat16 step: __expf is not torch's exp
        torch.testing.assert_close(row.route_weights.float(), expected.float(), rtol=8e-3, atol=0)


@pytest.mark.parametrize("pdl", [True, False])
def test_row_gemv_adds_the_residual_to_the_product_as_rounded(pdl) -> None:
    """``row_gemv.cu`` at the o projection's released shape ([2048, 4096]): bf16(res + bf16(W @ x))
    within one bfloat16 step of the float64 product (the sum's order is the kernel's own), and a
    second call bit-exact."""
    generator = torch.Generator(device="cuda").manual_seed(3)
    weight = (torch.randn(2048, 4096, device="cuda", generator=generator) / 64).to(torch.bfloat16)
    x = torch.randn(1, 4096, device="cuda", generator=generator).to(torch.bfloat16)
    res = torch.randn(1, 2048, device="cuda", generator=generator).to(torch.bfloat16)
    kernel = row_gemv.row_gemv(weight)
    assert kernel is not None and kernel.plan.blocks == 128
    got = kernel(x, res, pdl=pdl)
    again = kernel(x, res, pdl=pdl)
    product = (weight.double() @ x[0].double()).to(torch.bfloat16).double()
    expected = (res[0].double() + product).to(torch.bfloat16)
    torch.testing.assert_close(got[0].float(), expected.float(), rtol=8e-3, atol=8e-3)
    assert torch.equal(again, got)


def test_one_row_o_projection_kernel_equals_the_triton_kernel(stack) -> None:
    text, layers, rotary = stack
    at, hidden, cos_sin, mask = _inputs(text, rotary, [300], 512)
    fused = fused_decode_layers(layers, list(layers), "pdl")
    assert fused is not None and fused[0].row_o is not None, "an H100/H200 takes row_gemv.cu for o"
    got = _run(fused[0], hidden, cos_sin, mask, _cache(text, at, 512))
    fused[0].row_o = None
    expected = _run(fused[0], hidden, cos_sin, mask, _cache(text, at, 512))
    torch.cuda.synchronize()
    scale = expected.float().abs().max().item()
    assert (got.float() - expected.float()).abs().max().item() <= 1e-2 * scale


@pytest.mark.parametrize(("write", "view"), [([700], 1024), ([3, 250, 511, 40], 512)])
def test_the_attention_merge_four_splits_a_round_equals_one_a_round(stack, write, view, monkeypatch) -> None:
    """The attention's last program merging ``MERGE_CHUNK`` splits a round (their loads in flight
    together): the same merges in the same order as one a round, so the same bits."""
    text, layers, rotary = stack
    at, hidden, cos_sin, mask = _inputs(text, rotary, write, view)
    fused = fused_decode_layers(layers, list(layers), "pdl")
    assert fused is not None
    assert moe_layer.MERGE_CHUNK == 4
    got = _run(fused[0], hidden, cos_sin, mask, _cache(text, at, view))
    monkeypatch.setattr(moe_layer, "MERGE_CHUNK", 1)
    expected = _run(fused[0], hidden, cos_sin, mask, _cache(text, at, view))
    torch.cuda.synchronize()
    assert torch.equal(got, expected)
