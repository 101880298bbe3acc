"""The one-row MoE block kernel (executor/moe_experts.cu): its sizes for a layer's shape
(``plan``, exact table) and its compilation by NVRTC for Hopper at the released Qwen3-Omni-30B-A3B
thinker's shape, with no spills (NVRTC needs no GPU; the kernel's results are checked against
transformers on a GPU in tests/gpu/test_moe_layer_cuda.py)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from omni_runtime.executor import moe_experts
from omni_runtime.executor.moe_experts import RowPlan, loads, plan, row_experts, usable

RELEASED = {"hidden": 2048, "inter": 768, "experts": 128, "top_k": 8, "normalize": True}


@pytest.mark.parametrize(
    ("shape", "sms", "expected"),
    [
        # H200/H100: 132 multiprocessors, 128 blocks of 16 hidden rows and 48 units, 192 KB of down rows
        # (+ 24 KB of activations as float, the 4 KB normed row, sums and routing)
        (RELEASED, 132, (128, 256, 225_672)),
        # fewer multiprocessors: 64 blocks would each hold 32 rows of every routed expert
        (RELEASED, 100, "a block's down rows need 422280 bytes of shared memory"),
        (RELEASED, 7, "no block count up to 7 splits 2048 rows, 768 units and 128 experts"),
        ({**RELEASED, "hidden": 1000}, 132, "hidden size 1000 is not a multiple of 256"),
        ({**RELEASED, "hidden": 16384}, 132, "hidden size 16384 needs 2048 threads a block (1024 at most)"),
        ({**RELEASED, "inter": 700}, 132, "expert width 700 is not a multiple of 256"),
        ({**RELEASED, "experts": 60, "top_k": 4}, 132, "60 experts, top 4: experts must be a multiple of 32 and k at most 32"),
        ({**RELEASED, "inter": 1536}, 132, "a block's down rows need 446856 bytes of shared memory"),
    ],
)  # fmt: skip
def test_plan(shape, sms, expected) -> None:
    got = plan(**shape, multiprocessors=sms)
    if isinstance(expected, str):
        assert got == expected
    else:
        assert isinstance(got, RowPlan)
        assert (got.blocks, got.threads, got.shared_bytes) == expected


@pytest.mark.parametrize(("depth", "min_blocks", "trace"), [(2, 1, False), (1, 2, False), (2, 2, True)])
def test_the_released_shape_compiles_for_hopper_without_spills(depth, min_blocks, trace) -> None:
    row_plan = plan(**RELEASED, multiprocessors=132)
    assert isinstance(row_plan, RowPlan)
    row_plan = dataclasses.replace(row_plan, depth=depth, min_blocks=min_blocks, trace=trace)
    cubin, log = moe_experts.compile_cubin(row_plan, "sm_90")
    assert cubin[:4] == b"\x7fELF"
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in log, log
    registers = int(re.search(r"Used (\d+) registers", log).group(1))  # type: ignore[union-attr]
    assert registers * row_plan.threads * min_blocks <= 65536, log  # the blocks asked for fit


def test_a_source_error_names_the_file_and_nvrtc_says_why(monkeypatch) -> None:
    monkeypatch.setattr(
        moe_experts, "source", lambda: 'extern "C" __global__ void moe_experts_row() { oops; }'
    )
    row_plan = plan(**RELEASED, multiprocessors=132)
    assert isinstance(row_plan, RowPlan)
    with pytest.raises(RuntimeError, match=r"moe_experts.cu does not compile for sm_90:[\s\S]*oops"):
        moe_experts.compile_cubin(row_plan, "sm_90")


def test_weights_the_kernel_cannot_read_are_named() -> None:
    cpu = torch.device("cpu")
    flat = torch.zeros(64, dtype=torch.bfloat16)
    assert usable(flat[:16], cpu)
    assert not usable(flat[1:17], cpu)  # 2 bytes past an aligned start
    assert not usable(flat[:16].float(), cpu)
    assert not usable(flat.view(8, 8).t(), cpu)  # not contiguous
    assert not usable(flat, torch.device("meta"))


def test_a_cpu_layer_keeps_the_triton_kernels() -> None:
    weights = {
        "post_norm": torch.ones(256, dtype=torch.bfloat16),
        "router": torch.zeros(32, 256, dtype=torch.bfloat16),
        "gate_up": torch.zeros(32, 512, 256, dtype=torch.bfloat16),
        "down": torch.zeros(32, 256, 256, dtype=torch.bfloat16),
    }
    assert row_experts(**weights, top_k=4, normalize=True, eps=1e-6) is None


def test_a_kernel_that_does_not_compile_or_load_leaves_the_triton_kernels_and_says_so(
    monkeypatch, caplog
) -> None:
    """Checked when the layer is built, not at its first decode step: a GPU whose driver cannot
    load the cubin would otherwise fail every request."""
    row_plan = plan(**RELEASED, multiprocessors=132)
    assert isinstance(row_plan, RowPlan)

    def refuse(plan: RowPlan, device_index: int) -> None:
        raise RuntimeError("cuModuleLoadData failed: CUDA_ERROR_UNSUPPORTED_PTX_VERSION")

    monkeypatch.setattr(moe_experts, "_function", refuse)
    with caplog.at_level("WARNING", logger="omni_runtime.executor.moe_experts"):
        assert loads(row_plan, 0) is False
    assert "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" in caplog.text
    assert "keep the Triton kernels" in caplog.text and "OMNI_MOE_ROW_KERNEL=0" in caplog.text
    monkeypatch.setattr(moe_experts, "_function", lambda plan, device_index: (None, None))
    assert loads(row_plan, 0) is True
