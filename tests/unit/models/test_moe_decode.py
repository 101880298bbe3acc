"""The fused MoE decode kernels (executor.moe_decode): their choices as table tests here, their
results under Triton's interpreter in a process of their own (triton_interpreted/), compiled on
a GPU in tests/gpu/test_moe_decode_gpu.py and the decode bench."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omni_runtime.executor import moe_decode
from omni_runtime.executor.moe_decode import LaunchConfig, launch_config

INTERPRETED = Path(__file__).parent / "triton_interpreted"


@pytest.mark.slow
def test_kernels_under_the_triton_interpreter_equal_transformers_experts() -> None:
    """Triton decides interpretation when it is imported, and this process has imported it
    compiled: the interpreted tests run in a pytest of their own."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(INTERPRETED)],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-4000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout


def experts_module(
    *, experts: int, hidden: int, intermediate: int, top_k: int, dtype: torch.dtype, seed: int
):
    from transformers import Qwen3OmniMoeConfig
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf

    text = Qwen3OmniMoeConfig().thinker_config.text_config
    text.num_experts, text.hidden_size, text.moe_intermediate_size = experts, hidden, intermediate
    text.num_experts_per_tok = top_k
    text._experts_implementation = "eager"
    return hf.Qwen3OmniMoeThinkerTextSparseMoeBlock(text).to(dtype)


def test_cpu_tensors_without_the_interpreter_take_grouped_gemm(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    block = experts_module(experts=8, hidden=32, intermediate=16, top_k=2, dtype=torch.float32, seed=2)
    assert not moe_decode.fusable(block.experts, torch.zeros(1, 32))


def test_mismatched_expert_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="hidden size 32"):
        moe_decode.fused_experts(
            torch.zeros(1, 32),
            torch.zeros(1, 2, dtype=torch.long),
            torch.zeros(1, 2),
            torch.zeros(4, 20, 30),
            torch.zeros(4, 32, 10),
        )


@pytest.mark.parametrize(
    ("rows", "hidden", "intermediate", "top_k", "expected"),
    [
        # Qwen3-Omni-30B-A3B thinker (H 2048, I 768, top-8): one shape at every row count.
        (1, 2048, 768, 8, LaunchConfig(8, 512, 4, 256)),
        (8, 2048, 768, 8, LaunchConfig(8, 512, 4, 256)),
        (16, 2048, 768, 8, LaunchConfig(8, 512, 4, 256)),
        # Its talker (H 1024, I 384, top-6) at batch 1 and 4.
        (1, 1024, 384, 6, LaunchConfig(8, 512, 4, 256)),
        (4, 1024, 384, 6, LaunchConfig(8, 512, 4, 256)),
        # Tiny shapes: inner tiles shrink to the next power of two (at least 16).
        (2, 40, 24, 2, LaunchConfig(8, 64, 4, 32)),
    ],
)
def test_launch_config_table(rows, hidden, intermediate, top_k, expected) -> None:
    assert launch_config(rows, hidden, intermediate, top_k) == expected


def test_kernels_compile_for_hopper_without_a_gpu_with_16_byte_weight_loads() -> None:
    """The compiled path (not the interpreter): the experts kernels and the router kernel lower to sm_90 code, and with the
    divisibility Triton specializes on at launch (16-aligned pointers, sizes and strides that are
    multiples of 16, as every released shape has) the weight loads are 16-byte vector loads."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    gate_up, down = moe_decode._kernels()
    sizes = {"HIDDEN": 2048, "INTERMEDIATE": 768, "TOP_K": 8}
    cases = [  # kernel, pointer args, int args, constexprs, pointer types, 16-byte weight loads
        (
            gate_up,
            ["x_ptr", "index_ptr", "w_ptr", "act_ptr"],
            ["stride_x", "stride_we", "stride_wn"],
            sizes | {"BLOCK_N": 8, "BLOCK_H": 512, "PDL": False, "trace_ptr": None, "TRACE": False},
            {"index_ptr": "*i64"},
            True,
        ),
        (
            down,
            ["act_ptr", "index_ptr", "weight_ptr", "w_ptr", "out_ptr"],
            ["stride_we", "stride_wh", "stride_out"],
            sizes | {"BLOCK_D": 4, "BLOCK_I": 256},
            {"index_ptr": "*i64"},
            True,
        ),
        (
            moe_decode._route_kernel(),
            ["logits_ptr", "weights_ptr", "index_ptr"],
            ["stride_l"],
            {"EXPERTS": 128, "BLOCK_E": 128, "TOP_K": 8, "NORMALIZE": True},
            {"index_ptr": "*i64"},
            False,
        ),
    ]
    for kernel, pointers, ints, constexprs, types, vector_loads in cases:
        signature = {name: types.get(name, "*bf16") for name in pointers}
        signature |= {name: "i32" for name in ints} | {name: "constexpr" for name in constexprs}
        attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(pointers) + len(ints))}
        compiled = triton.compile(
            ASTSource(kernel, signature=signature, constexprs=constexprs, attrs=attrs),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": 4},
        )
        loads = [
            line.split("{")[0].split()[-1] for line in compiled.asm["ptx"].splitlines() if "ld.global" in line
        ]
        if vector_loads:
            assert "ld.global.v4.b32" in loads, loads  # 8 bfloat16 weights per load
        assert compiled.asm["cubin"]
