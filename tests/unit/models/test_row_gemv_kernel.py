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
        ({"k": 2048, "n": 5120}, 132, (128, 40, 163_848)),  # the fused q/k/v rows
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


def test_a_plan_whose_rows_do_not_fit_shared_memory_says_so() -> None:
    assert plan(k=65536, n=2048, multiprocessors=132) == (
        "a block's 16 rows of 65536 need 2097160 bytes of shared memory"
    )


@pytest.mark.parametrize("trace", [False, True])
def test_the_o_projection_compiles_for_hopper_without_spills(trace) -> None:
    gemv_plan = plan(k=4096, n=2048, multiprocessors=132)
    assert isinstance(gemv_plan, GemvPlan)
    cubin, log = row_gemv.compile_cubin(dataclasses.replace(gemv_plan, trace=trace), "sm_90")
    assert cubin[:4] == b"\x7fELF"
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in log, log
    registers = int(re.search(r"Used (\d+) registers", log).group(1))  # type: ignore[union-attr]
    assert registers * gemv_plan.threads <= 65536, log


def test_a_cpu_weight_keeps_the_triton_kernel() -> None:
    assert row_gemv.row_gemv(torch.zeros(2048, 4096, dtype=torch.bfloat16)) is None
