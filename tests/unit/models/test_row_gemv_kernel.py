"""The one-row matrix-vector kernel (executor/row_gemv.cu): its sizes for a weight's shape (``plan``,
exact table) and its compilation by NVRTC for Hopper at the released Qwen3-Omni-30B-A3B thinker's
o projection, with no spills (NVRTC needs no GPU; its results are checked on a GPU in
tests/gpu/test_moe_layer_cuda.py)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from omni_runtime.executor import row_gemv
from omni_runtime.executor.row_gemv import GemvPlan, plan


@pytest.mark.parametrize(
    ("shape", "sms", "expected"),
    [
        # the o projection on an H200/H100: 128 blocks of 16 rows of 4096, 128 KB of rows a block
        ({"k": 4096, "n": 2048}, 132, (128, 16, 131_080)),
        ({"k": 2048, "n": 5120}, 132, (128, 40, 163_848)),  # the fused q/k/v rows in shared memory
        ({"k": 4096, "n": 2048}, 100, "a block's 32 rows of 4096 need 262152 bytes of shared memory"),
        ({"k": 1000, "n": 2048}, 132, "input width 1000 is not a multiple of 256"),
        ({"k": 4096, "n": 1000}, 132, (125, 8, 65_544)),
        ({"k": 4096, "n": 1001}, 132, "no block count up to 132 splits 1001 rows into whole warps' shares"),
    ],
)  # fmt: skip
def test_plan(shape, sms, expected) -> None:
    got = plan(**shape, multiprocessors=sms)
    if isinstance(expected, str):
        assert got == expected
    else:
        assert isinstance(got, GemvPlan)
        assert (got.blocks, got.rows, got.shared_bytes) == expected


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        # the fused q/k/v projection of the normed row: 128 blocks, 5 rows a warp, 3 before the wait
        ({"k": 2048, "n": 5120}, (128, 40, 3, 0)),
        ({"k": 2048, "n": 2048}, (128, 16, 2, 0)),  # 2 rows a warp: both before the wait
        ({"k": 4096, "n": 5120}, "input width 4096 is not 2048 (the norm takes 8 values a thread)"),
        ({"k": 2048, "n": 20480}, "no block count up to 132 splits 20480 rows into whole warps' shares"),
    ],
)  # fmt: skip
def test_plan_with_the_input_norm(shape, expected) -> None:
    got = plan(**shape, multiprocessors=132, norm=True)
    if isinstance(expected, str):
        assert got == expected
    else:
        assert isinstance(got, GemvPlan) and got.norm and got.kernel == "row_gemv_normed"
        assert (got.blocks, got.rows, got.prefetch, got.shared_bytes) == expected


def test_a_plan_whose_rows_do_not_fit_shared_memory_says_so() -> None:
    assert plan(k=65536, n=2048, multiprocessors=132) == (
        "a block's 16 rows of 65536 need 2097160 bytes of shared memory"
    )


@pytest.mark.parametrize(
    ("shape", "trace", "most_registers"),
    [
        ({"k": 4096, "n": 2048}, False, 255),  # the o projection
        ({"k": 4096, "n": 2048}, True, 255),
        # the q/k/v projection: at most 128 a thread, so that a block fits beside a MoE block's 128
        ({"k": 2048, "n": 5120, "norm": True}, False, 128),
        ({"k": 2048, "n": 5120, "norm": True}, True, 128),
    ],
)
def test_the_released_projections_compile_for_hopper(shape, trace, most_registers) -> None:
    gemv_plan = plan(**shape, multiprocessors=132)
    assert isinstance(gemv_plan, GemvPlan)
    cubin, log = row_gemv.compile_cubin(dataclasses.replace(gemv_plan, trace=trace), "sm_90")
    assert cubin[:4] == b"\x7fELF"
    spilled = re.search(r"(\d+) bytes spill stores", log)
    assert spilled is not None and int(spilled.group(1)) <= 8, log  # a register or two at most
    registers = int(re.search(r"Used (\d+) registers", log).group(1))  # type: ignore[union-attr]
    assert registers <= most_registers and registers * gemv_plan.threads <= 65536, log


def test_a_cpu_weight_keeps_the_triton_kernel() -> None:
    assert row_gemv.row_gemv(torch.zeros(2048, 4096, dtype=torch.bfloat16)) is None
