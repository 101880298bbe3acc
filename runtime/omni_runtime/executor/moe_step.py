"""A Qwen3-MoE thinker's one-row decode step, every layer in one CUDA kernel (``moe_step.cu``;
issue 17: decode at batch 1 within 1.5x of the bandwidth bound).

The fused decode layer (executor.moe_layer) runs a one-row step as four kernels a layer: q/k/v,
attention, o, the MoE block (``moe_experts.cu``). Between them the GPU drains and ramps, and the
attention's and the router's short dependency chains leave HBM idle. ``moe_step.cu`` runs all
the layers in one kernel of one block a multiprocessor: each phase's weights are copied into
shared memory by the copy engine while the phase before works or waits (the next layer's q/k/v
rows during this layer's last exchange, the o rows during the attention), and the phases hand
their values over through tagged words in a workspace instead of kernel boundaries (the
kernel's header says how).

This module is the kernel's edge: :func:`plan` (pure: the kernel's compile-time sizes for a
stack's shape, or why it does not take it), compilation by NVRTC and launch through the driver
API (``moe_experts``' helpers), and :class:`RowStep`, the slot decoder's ``decode_stack``: it takes
a one-row decode step's layers and returns None for anything else (the layers then run one by one).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from omni_runtime.executor import moe_experts
from omni_runtime.executor.moe_layer import MoeLayerWeights

log = logging.getLogger(__name__)

POLL_NS = 64  # a waiting thread's pause between polls of a published value
MIN_KEYS = 64  # least cached keys an attention split takes (a multiple of 32)
KERNEL = "moe_step_row"
FIELDS = 12  # pointers a layer in the table (moe_step.cu's T_FIELDS)


@dataclass(frozen=True)
class StepPlan:
    """The kernel's compile-time sizes (``-D`` defines) and launch shape for one stack shape."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    experts: int
    top_k: int
    blocks: int
    threads: int
    normalize: bool
    poll_ns: int = POLL_NS
    min_keys: int = MIN_KEYS
    trace: bool = False
    trace_layer: int = 1

    @property
    def qkv_rows(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def shared_bytes(self) -> int:
        """Weights (the largest of a block's q/k/v, o and routed down rows), activations, a normed
        row and the small arrays and barrier."""
        rows = self.hidden // self.blocks
        weights = max(
            self.qkv_rows // self.blocks * self.hidden * 2,
            rows * self.heads * self.head_dim * 2,
            self.top_k * rows * self.inter * 2,
        )
        floats = max(self.top_k * self.inter, self.heads * self.head_dim)
        return weights + floats * 4 + self.hidden * 2 + 32 * 4 * 6 + 8

    @property
    def counts_at(self) -> int:
        """Where a layer's attention counters start in its workspace (WS_COUNT); its routing (the
        experts, then the weights' bfloat16 bits, 32 words each) follows 32 words later."""
        return (
            2 * self.hidden
            + self.qkv_rows
            + self.heads * self.head_dim
            + 2 * self.experts
            + self.top_k * self.inter
        )

    @property
    def workspace_words(self) -> int:
        """A layer's 32-bit words in the workspace (moe_step.cu's WS_WORDS)."""
        splits = self.blocks // self.kv_heads
        groups = self.heads // self.kv_heads
        words = self.hidden + self.qkv_rows + self.heads * self.head_dim + self.hidden
        words += 2 * self.experts + self.top_k * self.inter + 32 + 64
        return words + 2 * self.kv_heads * splits * groups + self.kv_heads * splits * groups * self.head_dim

    def defines(self) -> dict[str, int]:
        return {
            "HIDDEN": self.hidden,
            "HEADS": self.heads,
            "KV_HEADS": self.kv_heads,
            "HEAD_DIM": self.head_dim,
            "INTER": self.inter,
            "EXPERTS": self.experts,
            "TOP_K": self.top_k,
            "NCTA": self.blocks,
            "THREADS": self.threads,
            "NORMALIZE": int(self.normalize),
            "POLL_NS": self.poll_ns,
            "MIN_KEYS": self.min_keys,
            "TRACE": int(self.trace),
            "TRACE_LAYER": self.trace_layer,
            "WORKSPACE_WORDS": self.workspace_words,
            "COUNTS_AT": self.counts_at,
            "FIELDS": FIELDS,
            "SHARED_BYTES": self.shared_bytes,
        }


def plan(
    *,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    inter: int,
    experts: int,
    top_k: int,
    normalize: bool,
    multiprocessors: int,
) -> StepPlan | str:
    """The kernel's sizes for a stack of this shape on a GPU of ``multiprocessors``, or a sentence
    saying why it does not take it (the caller keeps the layer kernels)."""
    if hidden % 256:
        return f"hidden size {hidden} is not a multiple of 256"
    threads = hidden // 8
    warps = threads // 32
    if threads > 1024:
        return f"hidden size {hidden} needs {threads} threads a block (1024 at most)"
    if head_dim != 128 or heads % kv_heads or heads // kv_heads != warps:
        return f"{heads} query heads over {kv_heads} of {head_dim}: the kernel takes a warp a query head of a group of {warps}, heads of 128"
    if inter % 256 or (heads * head_dim) % max(256, threads * 4):
        return (
            f"expert width {inter} or attention width {heads * head_dim} does not split in 256-value chunks"
        )
    if experts % 32 or top_k > 32:
        return f"{experts} experts, top {top_k}: experts must be a multiple of 32 and k at most 32"
    qkv_rows = (heads + 2 * kv_heads) * head_dim
    for blocks in sorted(range(top_k, multiprocessors + 1, top_k), reverse=True):
        rows = hidden // blocks if hidden % blocks == 0 else 0
        units = inter // (blocks // top_k) if inter % (blocks // top_k) == 0 else 0
        if not rows or rows % (2 * warps) or rows > 32 or not units or units % warps or experts % blocks:
            continue
        if qkv_rows % blocks or (qkv_rows // blocks) % warps or blocks % kv_heads:
            continue
        candidate = StepPlan(
            hidden, heads, kv_heads, head_dim, inter, experts, top_k, blocks, threads, normalize
        )
        if candidate.shared_bytes > moe_experts.SHARED_LIMIT:
            return f"a block's weights need {candidate.shared_bytes} bytes of shared memory"
        return candidate
    return f"no block count up to {multiprocessors} splits the stack's rows, units and heads"


def compile_cubin(step_plan: StepPlan, arch: str) -> tuple[bytes, str]:
    """(cubin, ptxas log) of ``moe_step.cu`` at ``step_plan``'s sizes for ``arch``, by NVRTC."""
    return moe_experts.compile_source(
        moe_experts.kernel_source("moe_step.cu"), "moe_step.cu", step_plan.defines(), arch
    )


@functools.cache
def _function(step_plan: StepPlan, device_index: int) -> Any:
    compile_for = functools.partial(compile_cubin, step_plan)
    return moe_experts.load_for_device(compile_for, KERNEL, step_plan.shared_bytes, device_index)


class RowStep:
    """Every layer of a one-row decode step as one kernel launch: the stack's weights, its table
    of pointers (with the slot cache's buffers), the workspace and the launch count.

    Called as the slot decoder's ``decode_stack``: ``(hidden [b, 1, H], position_embeddings,
    cache)`` gives the last layer's output [1, 1, H] for one row, else None."""

    def __init__(self, step_plan: StepPlan, layers: Sequence[MoeLayerWeights], *, pdl: bool = True) -> None:
        first = layers[0]
        self.plan, self.layers, self.pdl = step_plan, list(layers), pdl
        self.eps, self.qk_eps, self.scale = first.eps, first.qk_eps, first.scaling
        device = self.device = first.qkv.device
        self.workspace = torch.zeros(len(layers), step_plan.workspace_words, dtype=torch.int32, device=device)
        self.launches = torch.zeros(1, dtype=torch.int32, device=device)
        self._tables: dict[tuple[int, ...], torch.Tensor] = {}
        self.trace: torch.Tensor | None = None  # [2 blocks, 32] int64: phase marks of one layer when set

    def table(self, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> torch.Tensor:
        """The kernel's [layers, FIELDS] pointers for these cache buffers (built once for each)."""
        key = tuple(t.data_ptr() for t in (*keys, *values))
        found = self._tables.get(key)
        if found is None:
            rows = []
            for i, w in enumerate(self.layers):
                fields = (
                    w.input_norm, w.qkv, w.q_norm, w.k_norm, w.o_proj, w.post_norm, w.router,
                    w.gate_up, w.down, keys[i], values[i], self.workspace[i],
                )  # fmt: skip
                rows.append([t.data_ptr() for t in fields])
            found = self._tables[key] = torch.tensor(rows, dtype=torch.int64, device=self.device)
        return found

    def takes(self, hidden: torch.Tensor, cache: Any) -> bool:
        keys = getattr(cache, "keys", None)
        return (
            hidden.dim() == 3
            and hidden.shape[0] == 1
            and hidden.shape[1] == 1
            and hidden.device == self.device
            and hidden.dtype == torch.bfloat16
            and getattr(cache, "prefill_slots", 0) is None
            and keys is not None
            and len(keys) == len(self.layers)
            and getattr(cache, "write_pos", None) is not None
        )

    def __call__(self, hidden: torch.Tensor, position_embeddings: Any, cache: Any) -> torch.Tensor | None:
        if position_embeddings is None or not self.takes(hidden, cache):
            return None
        head_dim = self.plan.head_dim
        cos, sin = (t.reshape(t.shape[0], -1)[0, -head_dim:].contiguous() for t in position_embeddings)
        keys = cache.keys
        out = self.run(hidden[0, 0], cos, sin, cache.write_pos[:1], keys, cache.values)
        return out[None, None]

    def run(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        write_pos: torch.Tensor,
        keys: Sequence[torch.Tensor],
        values: Sequence[torch.Tensor],
    ) -> torch.Tensor:
        """The stack's output [H] for ``hidden`` [H] at position ``write_pos`` [1] (int64), the new
        keys and values written to slot 0 of ``keys``/``values`` (one [slots, kv_heads, max_len,
        head_dim] buffer a layer)."""
        table = self.table(keys, values)
        step_plan = self.plan if self.trace is None else dataclasses.replace(self.plan, trace=True)
        _module, function = _function(step_plan, moe_experts.device_index(self.device))
        x = hidden.contiguous()
        position = write_pos.to(torch.int64).contiguous()
        out = torch.empty_like(x)
        args: list[Any] = [ctypes.c_uint64(table.data_ptr()), ctypes.c_int(len(self.layers))]
        args += [ctypes.c_uint64(t.data_ptr()) for t in (x, cos, sin, position)]
        args += [ctypes.c_int64(keys[0].stride(1)), ctypes.c_int64(keys[0].stride(2))]
        args += [ctypes.c_uint64(self.launches.data_ptr()), ctypes.c_uint64(out.data_ptr())]
        args += [ctypes.c_float(self.eps), ctypes.c_float(self.qk_eps), ctypes.c_float(self.scale)]
        args.append(ctypes.c_uint64(0 if self.trace is None else self.trace.data_ptr()))
        moe_experts.launch(
            function, args, blocks=self.plan.blocks, threads=self.plan.threads,
            shared_bytes=self.plan.shared_bytes, device=self.device, pdl=self.pdl,
        )  # fmt: skip
        return out


def usable(layers: Sequence[MoeLayerWeights]) -> bool:
    """Whether the kernel can read every layer's weights as it does (moe_experts.usable) and the
    layers agree on their shape and constants."""
    if not layers:
        return False
    first = layers[0]
    device = first.qkv.device
    for w in layers:
        tensors = (
            w.input_norm,
            w.qkv,
            w.q_norm,
            w.k_norm,
            w.o_proj,
            w.post_norm,
            w.router,
            w.gate_up,
            w.down,
        )
        if not all(moe_experts.usable(t, device) for t in tensors):
            return False
        same = (w.heads, w.kv_heads, w.head_dim, w.top_k, w.normalize, w.eps, w.qk_eps, w.scaling)
        if same != (first.heads, first.kv_heads, first.head_dim, first.top_k, first.normalize, first.eps,
                    first.qk_eps, first.scaling):  # fmt: skip
            return False
        if w.gate_up.shape != first.gate_up.shape or w.qkv.shape != first.qkv.shape:
            return False
    return True


def row_step(layers: Sequence[MoeLayerWeights], *, pdl: bool = True) -> RowStep | None:
    """The one-kernel step for a stack with these layers' weights, compiled and loaded now, or None
    where it does not run: not a GPU of compute capability 9.0 or later, weights it cannot read,
    a shape it does not take, no ``cuda.bindings``, or a kernel that does not compile or load here
    (logged: the layers keep their kernels rather than fail every decode step)."""
    if not layers or not usable(layers) or not moe_experts.driver_kernels_run(layers[0].qkv.device, []):
        return None
    first = layers[0]
    device = first.qkv.device
    experts, hidden, inter = first.down.shape
    step_plan = plan(
        hidden=hidden, heads=first.heads, kv_heads=first.kv_heads, head_dim=first.head_dim, inter=inter,
        experts=experts, top_k=first.top_k, normalize=first.normalize,
        multiprocessors=torch.cuda.get_device_properties(device).multi_processor_count,
    )  # fmt: skip
    if isinstance(step_plan, str):
        log.info("the one-kernel decode step does not take this stack (%s)", step_plan)
        return None
    if not moe_experts.loads_or_warns(
        lambda: _function(step_plan, moe_experts.device_index(device)), "the one-kernel decode step",
        "one-row steps keep the layer kernels", "OMNI_MOE_STEP_KERNEL",
    ):  # fmt: skip
        return None
    return RowStep(step_plan, layers, pdl=pdl)
