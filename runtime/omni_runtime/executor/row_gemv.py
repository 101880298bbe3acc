"""One decode row's matrix-vector product plus residual with its weights copied into shared memory
before its input exists (``row_gemv.cu``; issue 17: decode at batch 1).

The fused decode layer's o projection (executor.moe_layer) follows the attention, whose dozen
programs leave HBM and the multiprocessors nearly idle for 6-7 µs at one row. The Triton
matrix-vector kernel reads the o rows into registers before its wait, but its 256 programs do not
all fit beside the attention (its last start up to 3 µs after the attention ends), so part of its
17 MB is read after.
``row_gemv.cu`` takes one block a multiprocessor, each asking the copy engine for all its rows
(128 KB at the released shape) as it starts: the whole matrix streams during the attention.

This module is the kernel's edge, as ``moe_experts`` is for the MoE block: :func:`plan` (pure),
NVRTC compilation and driver launches through ``moe_experts``' helpers, :class:`RowGemv` (one
weight's kernel) and :func:`row_gemv` (it, or None where it does not run).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import torch

from omni_runtime.executor import moe_experts

KERNEL = "row_gemv"
THREADS = 256
MAX_ROWS_PER_BLOCK = 64  # rows a block at most (the block's rows are ROWS x K in shared memory)


@dataclass(frozen=True)
class GemvPlan:
    """The kernel's compile-time sizes (``-D`` defines) and launch shape for a weight's shape."""

    k: int
    n: int
    blocks: int
    threads: int = THREADS
    trace: bool = False

    @property
    def rows(self) -> int:
        return self.n // self.blocks

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory: the block's rows and the barrier (the row sums are static)."""
        return self.rows * self.k * 2 + 8

    def defines(self) -> dict[str, int]:
        return {
            "K": self.k,
            "N": self.n,
            "NCTA": self.blocks,
            "THREADS": self.threads,
            "TRACE": int(self.trace),
        }


def plan(*, k: int, n: int, multiprocessors: int) -> GemvPlan | str:
    """The kernel's sizes for an [n, k] weight on a GPU of ``multiprocessors``, or a sentence saying
    why it does not take it (the caller keeps the Triton kernel): the most blocks up to one a
    multiprocessor that split the rows evenly, a multiple of the warps each, their rows fitting a
    block's shared memory."""
    if k % 256:
        return f"input width {k} is not a multiple of 256"
    warps = THREADS // 32
    for blocks in range(min(multiprocessors, n // warps), 0, -1):
        if n % blocks or (n // blocks) % warps or n // blocks > MAX_ROWS_PER_BLOCK:
            continue
        candidate = GemvPlan(k, n, blocks)
        if candidate.shared_bytes + candidate.rows * 4 > moe_experts.SHARED_LIMIT:
            return (
                f"a block's {candidate.rows} rows of {k} need {candidate.shared_bytes} bytes of shared memory"
            )
        return candidate
    return f"no block count up to {multiprocessors} splits {n} rows into whole warps' shares"


def compile_cubin(gemv_plan: GemvPlan, arch: str) -> tuple[bytes, str]:
    """(cubin, ptxas log) of ``row_gemv.cu`` at ``gemv_plan``'s sizes for ``arch``, by NVRTC."""
    return moe_experts.compile_source(
        moe_experts.kernel_source("row_gemv.cu"), "row_gemv.cu", gemv_plan.defines(), arch
    )


@functools.cache
def _function(gemv_plan: GemvPlan, device_index: int) -> Any:
    compile_for = functools.partial(compile_cubin, gemv_plan)
    return moe_experts.load_for_device(compile_for, KERNEL, gemv_plan.shared_bytes, device_index)


class RowGemv:
    """``out = res + weight @ x`` for one row, rounded as the Triton kernel: one weight's kernel."""

    def __init__(self, gemv_plan: GemvPlan, weight: torch.Tensor) -> None:
        self.plan, self.weight, self.device = gemv_plan, weight, weight.device

    def __call__(
        self, x: torch.Tensor, res: torch.Tensor, *, pdl: bool, trace: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x`` [1, K] and ``res`` [1, N] (contiguous, the weight's dtype and device): [1, N].
        ``trace`` (int64, at least [blocks, 8]): each block's marks (the kernel compiled with them)."""
        out = torch.empty_like(res)
        gemv_plan = self.plan if trace is None else dataclasses.replace(self.plan, trace=True)
        _module, function = _function(gemv_plan, moe_experts.device_index(self.device))
        values = [ctypes.c_uint64(t.data_ptr()) for t in (x, self.weight, res, out)]
        values.append(ctypes.c_uint64(0 if trace is None else trace.data_ptr()))
        moe_experts.launch(
            function, values, blocks=gemv_plan.blocks, threads=gemv_plan.threads,
            shared_bytes=gemv_plan.shared_bytes, device=self.device, pdl=pdl,
        )  # fmt: skip
        return out


def row_gemv(weight: torch.Tensor) -> RowGemv | None:
    """The kernel for ``weight`` [N, K], compiled and loaded now, or None where it does not run:
    a weight it cannot read (``moe_experts.usable``), not Hopper or later, no ``cuda.bindings``, a
    shape it does not take, or a kernel that does not compile or load (logged)."""
    device = weight.device
    if weight.dim() != 2 or not moe_experts.driver_kernels_run(device, [weight]):
        return None
    n, k = weight.shape
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    gemv_plan = plan(k=k, n=n, multiprocessors=sms)
    if isinstance(gemv_plan, str) or not moe_experts.loads_or_warns(
        lambda: _function(gemv_plan, moe_experts.device_index(device)), "the one-row matrix-vector kernel",
        "one-row decode steps keep the Triton kernel", "OMNI_MOE_ROW_KERNEL",
    ):  # fmt: skip
        return None
    return RowGemv(gemv_plan, weight)
