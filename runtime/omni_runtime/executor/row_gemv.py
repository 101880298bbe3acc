"""One decode row's matrix-vector product plus residual with its weights copied into shared memory
before its input exists (``row_gemv.cu``; issue 17: decode at batch 1).

The fused decode layer's o projection (executor.moe_layer) follows the attention, whose dozen
programs leave HBM and the multiprocessors nearly idle for 6-7 µs at one row. The Triton
matrix-vector kernel reads the o rows into registers before its wait, but its 256 programs do not
all fit beside the attention, so half of its 17 MB are read after the attention ends.
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
import logging
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch

from omni_runtime.executor import moe_experts
from omni_runtime.executor.triton_support import hopper_or_later

log = logging.getLogger(__name__)

KERNELS = {False: "row_gemv", True: "row_gemv_normed"}
THREADS = 256
MAX_ROWS_PER_BLOCK = 64  # rows a block at most (the block's rows are ROWS x K in shared memory)
MAX_ROWS_PER_WARP = 8  # with the input norm: rows a warp reads (PREFETCH of them before its wait)
PREFETCH = 3  # with the input norm: rows a warp reads before its wait (3 x 4 KB: 96 registers a thread)


@dataclass(frozen=True)
class GemvPlan:
    """The kernel's compile-time sizes (``-D`` defines) and launch shape for a weight's shape."""

    k: int
    n: int
    blocks: int
    threads: int = THREADS
    norm: bool = False  # row_gemv_normed: the input's RMSNorm first, rows in registers, no residual
    prefetch: int = 0  # with norm: rows a warp reads before its wait
    trace: bool = False

    @property
    def rows(self) -> int:
        return self.n // self.blocks

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory: the block's rows and the barrier (the row sums, and with the norm
        the normed row, are static; with the norm the rows are in registers)."""
        return 0 if self.norm else self.rows * self.k * 2 + 8

    @property
    def kernel(self) -> str:
        return KERNELS[self.norm]

    def defines(self) -> dict[str, int]:
        return {
            "K": self.k, "N": self.n, "NCTA": self.blocks, "THREADS": self.threads, "NORM": int(self.norm),
            "PREFETCH": self.prefetch, "TRACE": int(self.trace),
        }  # fmt: skip


def plan(*, k: int, n: int, multiprocessors: int, norm: bool = False) -> GemvPlan | str:
    """The kernel's sizes for an [n, k] weight on a GPU of ``multiprocessors``, or a sentence saying
    why it does not take it (the caller keeps the Triton kernel): the most blocks up to one a
    multiprocessor that split the rows evenly, a multiple of the warps each, their rows fitting a
    block's shared memory; with ``norm`` (the input normalised first, 8 of its values a thread) at
    most ``MAX_ROWS_PER_WARP`` rows a warp, ``PREFETCH`` of them read before the wait."""
    if k % 256:
        return f"input width {k} is not a multiple of 256"
    if norm and k != THREADS * 8:
        return f"input width {k} is not {THREADS * 8} (the norm takes 8 values a thread)"
    warps = THREADS // 32
    for blocks in range(min(multiprocessors, n // warps), 0, -1):
        if n % blocks or (n // blocks) % warps:
            continue
        if norm:
            per_warp = n // blocks // warps
            if per_warp > MAX_ROWS_PER_WARP:
                break
            return GemvPlan(k, n, blocks, norm=True, prefetch=min(PREFETCH, per_warp))
        if n // blocks > MAX_ROWS_PER_BLOCK:
            continue
        candidate = GemvPlan(k, n, blocks)
        if candidate.shared_bytes + candidate.rows * 4 > moe_experts.SHARED_LIMIT:
            return (
                f"a block's {candidate.rows} rows of {k} need {candidate.shared_bytes} bytes of shared memory"
            )
        return candidate
    return f"no block count up to {multiprocessors} splits {n} rows into whole warps' shares"


def source() -> str:
    return resources.files("omni_runtime.executor").joinpath("row_gemv.cu").read_text(encoding="utf-8")


def compile_cubin(gemv_plan: GemvPlan, arch: str) -> tuple[bytes, str]:
    """(cubin, ptxas log) of ``row_gemv.cu`` at ``gemv_plan``'s sizes for ``arch``, by NVRTC."""
    return moe_experts.compile_source(source(), "row_gemv.cu", gemv_plan.defines(), arch)


@functools.cache
def _function(gemv_plan: GemvPlan, device_index: int) -> Any:
    major, minor = torch.cuda.get_device_capability(device_index)
    cubin, _log = compile_cubin(gemv_plan, f"sm_{major}{minor}")
    return moe_experts.load_function(cubin, gemv_plan.kernel, gemv_plan.shared_bytes, device_index)


class RowGemv:
    """One row through one weight, rounded as the Triton kernel: ``res + weight @ x``, or with the
    norm's ``gain`` ``weight @ rmsnorm(x)``."""

    def __init__(
        self, gemv_plan: GemvPlan, weight: torch.Tensor, gain: torch.Tensor | None = None, eps: float = 0.0
    ) -> None:
        self.plan, self.weight, self.gain, self.eps, self.device = gemv_plan, weight, gain, eps, weight.device

    def __call__(
        self,
        x: torch.Tensor,
        res: torch.Tensor | None = None,
        *,
        pdl: bool,
        trace: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` [1, K] and, without the norm, ``res`` [1, N] (contiguous, the weight's dtype and
        device): [1, N]. ``trace`` (int64, at least [blocks, 8]): each block's marks (the kernel
        compiled with them)."""
        out = x.new_empty(1, self.plan.n)
        gemv_plan = self.plan if trace is None else dataclasses.replace(self.plan, trace=True)
        _module, function = _function(gemv_plan, moe_experts.device_index(self.device))
        tensors = (x, self.gain, self.weight, out) if self.gain is not None else (x, self.weight, res, out)
        values: list[Any] = [ctypes.c_uint64(t.data_ptr()) for t in tensors if t is not None]
        if self.gain is not None:
            values.append(ctypes.c_float(self.eps))
        values.append(ctypes.c_uint64(0 if trace is None else trace.data_ptr()))
        moe_experts.launch(
            function, values, blocks=gemv_plan.blocks, threads=gemv_plan.threads,
            shared_bytes=gemv_plan.shared_bytes, device=self.device, pdl=pdl,
        )  # fmt: skip
        return out


def row_gemv(weight: torch.Tensor, *, gain: torch.Tensor | None = None, eps: float = 0.0) -> RowGemv | None:
    """The kernel for ``weight`` [N, K] (with ``gain`` [K]: of the input's RMSNorm, epsilon ``eps``),
    compiled and loaded now, or None where it does not run: a tensor it cannot read
    (``moe_experts.usable``), not Hopper or later, no ``cuda.bindings``, a shape it does not take,
    or a kernel that does not compile or load (logged)."""
    device = weight.device
    tensors = [weight] if gain is None else [weight, gain]
    if (
        weight.dim() != 2
        or not hopper_or_later(device)
        or not all(moe_experts.usable(t, device) for t in tensors)
    ):
        return None
    try:
        import cuda.bindings.driver
        import cuda.bindings.nvrtc  # noqa: F401
    except ImportError:
        return None
    n, k = weight.shape
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    gemv_plan = plan(k=k, n=n, multiprocessors=sms, norm=gain is not None)
    if isinstance(gemv_plan, str):
        return None
    try:
        _function(gemv_plan, moe_experts.device_index(device))
    except RuntimeError as exc:
        log.warning(
            "the one-row matrix-vector kernel does not run on this GPU (%s); one-row decode steps keep the "
            "Triton kernel (OMNI_MOE_ROW_KERNEL=0 skips this check)",
            exc,
        )
        return None
    return RowGemv(gemv_plan, weight, gain, eps)
