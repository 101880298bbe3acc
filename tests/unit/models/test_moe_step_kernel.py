"""The one-kernel decode step (executor/moe_step.cu): its sizes for a stack's shape (exact table),
the kernel compiled by NVRTC for Hopper at the released Qwen3-Omni-30B-A3B thinker's shape with no
spills and within a block's shared memory (its workspace layout checked against moe_step.py's by
the compiler), and where it declines to run. The kernel itself runs in tests/gpu/test_moe_step_cuda.py.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from omni_runtime.executor import moe_experts, moe_step
from omni_runtime.executor.moe_step import StepPlan, plan

RELEASED = {
    "hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 128, "inter": 768, "experts": 128, "top_k": 8,
    "normalize": True,
}  # fmt: skip


def test_released_thinker_plan_on_an_h200() -> None:
    step_plan = plan(**RELEASED, multiprocessors=132)
    assert step_plan == StepPlan(2048, 32, 4, 128, 768, 128, 8, blocks=128, threads=256, normalize=True)
    assert step_plan.qkv_rows == 5120
    # q/k/v 40 rows, o 16 rows of 4096, down 8 x 16 rows of 768: the down rows are the largest
    assert step_plan.shared_bytes == 8 * 16 * 768 * 2 + 8 * 768 * 4 + 2048 * 2 + 32 * 4 * 6 + 8
    assert step_plan.shared_bytes <= moe_experts.SHARED_LIMIT
    assert step_plan.workspace_words == 2048 + 5120 + 4096 + 2048 + 256 + 6144 + 32 + 64 + 2 * 1024 + 131072
    assert step_plan.counts_at == 2048 + 5120 + 4096 + 2048 + 256 + 6144


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"hidden": 2000}, "hidden size 2000 is not a multiple of 256"),
        ({"head_dim": 64}, "32 query heads over 4 of 64"),
        ({"kv_heads": 8}, "32 query heads over 8 of 128"),
        ({"inter": 700}, "expert width 700"),
        ({"experts": 100}, "100 experts, top 8"),
    ],
)
def test_shapes_it_declines_say_why(change, reason) -> None:
    got = plan(**{**RELEASED, **change}, multiprocessors=132)
    assert isinstance(got, str) and got.startswith(reason)


def test_fewer_multiprocessors_take_fewer_blocks() -> None:
    assert plan(**RELEASED, multiprocessors=100).startswith(
        "a block's weights need"
    )  # 64: 384 KB of down rows
    assert isinstance(plan(**RELEASED, multiprocessors=7), str)


@pytest.mark.parametrize("trace", [False, True])
def test_kernel_compiles_for_hopper_without_spills(trace) -> None:
    step_plan = plan(**RELEASED, multiprocessors=132)
    assert isinstance(step_plan, StepPlan)
    cubin, log = moe_step.compile_cubin(dataclasses.replace(step_plan, trace=trace), "sm_90")
    assert cubin[:4] == b"\x7fELF"
    assert "0 bytes spill stores, 0 bytes spill loads" in log
    registers = int(re.search(r"Used (\d+) registers", log).group(1))
    assert registers * step_plan.threads <= 65536  # one block a multiprocessor fits


@pytest.mark.parametrize(
    ("field", "shift", "says"),
    [("counts_at", 4, "workspace layout differs"), ("shared_bytes", -1024, "less shared memory")],
)
def test_a_layout_that_differs_does_not_compile(field, shift, says) -> None:
    """The kernel checks moe_step.py's workspace layout and shared memory at compile time."""
    step_plan = plan(**RELEASED, multiprocessors=132)
    assert isinstance(step_plan, StepPlan)
    shifted = type("Shifted", (StepPlan,), {field: property(lambda self: getattr(step_plan, field) + shift)})
    with pytest.raises(RuntimeError, match=rf"moe_step.cu does not compile for sm_90:[\s\S]*{says}"):
        moe_step.compile_cubin(shifted(**dataclasses.asdict(step_plan)), "sm_90")


def test_no_step_kernel_off_a_gpu() -> None:
    from omni_runtime.executor.moe_layer import MoeLayerWeights

    h, i, e = 256, 256, 32
    weights = MoeLayerWeights(
        input_norm=torch.ones(h), qkv=torch.zeros((8 + 2) * 128, h), q_norm=torch.ones(128),
        k_norm=torch.ones(128), o_proj=torch.zeros(h, 8 * 128), post_norm=torch.ones(h),
        router=torch.zeros(e, h), gate_up=torch.zeros(e, 2 * i, h), down=torch.zeros(e, h, i),
        heads=8, kv_heads=1, head_dim=128, top_k=4, normalize=True, eps=1e-6, qk_eps=1e-6, scaling=0.088,
    )  # fmt: skip
    assert moe_step.row_step([weights]) is None
    assert moe_step.row_step([]) is None
