"""The fused MoE decode kernels (executor.moe_decode) run by Triton's interpreter on CPU tensors,
compared with transformers' own experts module (its per-expert loop) on the same weights and
routing. Collected only in a process started with TRITON_INTERPRET=1 (Triton reads it when it
is imported): tests/unit/models/test_moe_decode.py starts one."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import Qwen3OmniMoeConfig
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf

from omni_runtime.executor import moe_decode
from omni_runtime.executor.moe_decode import LaunchConfig

assert os.environ.get("TRITON_INTERPRET") == "1", "run under TRITON_INTERPRET=1 (see the docstring)"


def experts_module(
    *, experts: int, hidden: int, intermediate: int, top_k: int, dtype: torch.dtype, seed: int
):
    text = Qwen3OmniMoeConfig().thinker_config.text_config
    text.num_experts, text.hidden_size, text.moe_intermediate_size = experts, hidden, intermediate
    text.num_experts_per_tok = top_k
    text._experts_implementation = "eager"
    module = hf.Qwen3OmniMoeThinkerTextSparseMoeBlock(text).to(dtype)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) / param.shape[-1] ** 0.5)
    return module


@pytest.mark.parametrize(
    ("rows", "experts", "hidden", "intermediate", "top_k", "dtype", "tolerance"),
    [
        (1, 8, 64, 32, 2, torch.float32, 1e-5),
        (3, 16, 96, 40, 4, torch.float32, 1e-5),  # sizes that are no multiple of any block
        (5, 16, 48, 24, 8, torch.float32, 1e-5),
        (2, 16, 96, 40, 4, torch.bfloat16, 2e-2),  # the kernels round once, transformers per op
    ],
)
def test_fused_block_equals_transformers_experts(
    rows, experts, hidden, intermediate, top_k, dtype, tolerance
) -> None:
    block = experts_module(
        experts=experts, hidden=hidden, intermediate=intermediate, top_k=top_k, dtype=dtype, seed=rows
    )
    x = torch.randn(1, rows, hidden, generator=torch.Generator().manual_seed(7)).to(dtype)
    with torch.no_grad():
        expected = block(x)  # eager: transformers' per-expert loop
        moe_decode.register()
        block.experts.config._experts_implementation = moe_decode.NAME
        got = block(x)
    scale = expected.float().abs().max().item()
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert (got.float() - expected.float()).abs().max().item() <= tolerance * max(scale, 1.0)


def test_every_block_size_gives_the_same_result() -> None:
    block = experts_module(experts=8, hidden=80, intermediate=36, top_k=3, dtype=torch.float32, seed=1)
    x = torch.randn(2, 80, generator=torch.Generator().manual_seed(3))
    _, weights, index = block.gate(x)
    args = (x, index, weights, block.experts.gate_up_proj, block.experts.down_proj)
    with torch.no_grad():
        results = [
            moe_decode.fused_experts(*args, config=LaunchConfig(g, gc, d, dc))
            for g, gc, d, dc in [(8, 16, 4, 16), (16, 128, 16, 64), (4, 32, 8, 32)]
        ]
    for other in results[1:]:
        torch.testing.assert_close(other, results[0], rtol=1e-5, atol=1e-5)


def test_rows_above_the_limit_take_transformers_grouped_gemm(monkeypatch) -> None:
    block = experts_module(experts=8, hidden=32, intermediate=16, top_k=2, dtype=torch.float32, seed=2)
    rows = moe_decode.MAX_FUSED_ROWS + 1
    x = torch.randn(rows, 32, generator=torch.Generator().manual_seed(4))
    _, weights, index = block.gate(x)
    assert not moe_decode.fusable(block.experts, x)
    assert moe_decode.fusable(block.experts, x[: moe_decode.MAX_FUSED_ROWS])

    def no_kernels():
        raise AssertionError("the fused kernels ran above the row limit")

    monkeypatch.setattr(moe_decode, "_kernels", no_kernels)
    with torch.no_grad():
        got = moe_decode.fused_experts_forward(block.experts, x, index, weights)
        block.experts.config._experts_implementation = "eager"
        expected = block.experts(x, index, weights)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_compiled_block_keeps_the_fused_call_whole_at_any_row_count() -> None:
    """The runtime compiles decode layers (dynamic row count); the kernels' grid depends on the
    rows, so the launch sits behind the ``omni::fused_experts`` operator: one graph, no break, and
    the compiled block gives the eager block's result at several row counts."""
    block = experts_module(experts=16, hidden=96, intermediate=40, top_k=4, dtype=torch.float32, seed=3)
    moe_decode.register()
    block.experts.config._experts_implementation = moe_decode.NAME
    torch._dynamo.reset()
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True, dynamic=True)
    with torch.no_grad():
        for rows in (2, 3, 5):
            x = torch.randn(1, rows, 96, generator=torch.Generator().manual_seed(rows))
            assert torch.allclose(compiled(x), block(x), atol=1e-5)


@pytest.mark.parametrize(
    ("rows", "experts", "top_k", "normalize", "dtype"),
    [
        (1, 128, 8, True, torch.bfloat16),  # the 30B-A3B thinker's router
        (4, 128, 6, True, torch.bfloat16),  # its talker's top-6
        (3, 20, 4, False, torch.float32),  # a width that is no power of two, no renormalisation
    ],
)
def test_fused_router_equals_transformers_router(rows, experts, top_k, normalize, dtype) -> None:
    text = Qwen3OmniMoeConfig().thinker_config.text_config
    text.num_experts, text.hidden_size, text.num_experts_per_tok = experts, 64, top_k
    text.norm_topk_prob = normalize
    router = hf.Qwen3OmniMoeThinkerTextTopKRouter(text).to(dtype)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=torch.Generator().manual_seed(rows)))
        x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(11)).to(dtype)
        logits, weights, index = router(x)
        assert moe_decode.fuse_routers(router, True) == 1
        got_logits, got_weights, got_index = router(x)
        assert moe_decode.fuse_routers(router, False) == 1
        assert type(router) is hf.Qwen3OmniMoeThinkerTextTopKRouter
    assert torch.equal(got_logits, logits)
    assert torch.equal(got_index, index)  # same experts, same order
    assert got_weights.dtype == weights.dtype
    assert torch.allclose(
        got_weights.float(), weights.float(), atol=1e-6, rtol=1e-2 if dtype == torch.bfloat16 else 1e-6
    )


def test_compiled_router_keeps_the_fused_call_whole() -> None:
    text = Qwen3OmniMoeConfig().thinker_config.text_config
    text.num_experts, text.hidden_size, text.num_experts_per_tok = 16, 32, 4
    router = hf.Qwen3OmniMoeThinkerTextTopKRouter(text)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=torch.Generator().manual_seed(1)))
    moe_decode.fuse_routers(router, True)
    torch._dynamo.reset()
    compiled = torch.compile(router, backend="aot_eager", fullgraph=True, dynamic=True)
    with torch.no_grad():
        for rows in (2, 5):
            x = torch.randn(rows, 32, generator=torch.Generator().manual_seed(rows))
            for got, want in zip(compiled(x), router(x), strict=True):
                assert torch.equal(got, want)
