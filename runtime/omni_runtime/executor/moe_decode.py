"""Fused MoE experts for decode: two Triton kernels in place of the grouped GEMM.

A decode step of an MoE model sends a handful of rows (one per live slot) through each layer's
experts, each row to its top-k experts. transformers' ``grouped_mm`` path sorts the row-expert
pairs by expert, counts them per expert (a histogram over all E experts), gathers, runs two grouped
GEMMs over all E expert groups (most of them empty at decode), scatters back and sums: about a
dozen kernels per layer, for work that is two matrix-vector products per pair. Here it is two
kernels (in ``moe_layer_kernels``), each reading only the experts the rows were routed to:

1. ``gate_up``: for every (row, k) pair and a block of intermediate units, the gate and up
   products of the row with that expert's ``gate_up_proj`` rows, then ``silu(gate) * up``.
2. ``down``: for every row and a block of hidden units, the sum over its k experts of the routing
   weight times that expert's ``down_proj`` rows applied to the pair's activation. No atomics: a
   program owns its output block.

Both accumulate in float32 and are CUDA-graph capturable (the pair count is static per captured
batch). Prefill and larger batches, where a grouped GEMM reuses each expert's weights across many
rows, keep transformers' ``grouped_mm`` (``MAX_FUSED_ROWS``). A third kernel fuses the router's
softmax, top-k and renormalisation (``fuse_routers``). The launches go through ``torch.library``
custom ops, so ``torch.compile``d layers keep each as one opaque call. Registered in transformers'
``ExpertsInterface`` as ``omni_fused``: the Qwen3 thinker's default where Triton is installed
(models.qwen3_omni_moe.loader; ``OMNI_MOE_EXPERTS`` overrides). On an H200 the experts call at one
row takes 29 µs against grouped_mm's 88 (``python -m omni_runtime.bench.moe_kernel``;
docs/benchmarks.md). Triton's interpreter (``TRITON_INTERPRET=1``) runs the same kernels on CPU
tensors, which is how the CPU tests check them against transformers' experts and router; the CPU
tests also compile them for sm_90 without a GPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from omni_runtime.executor.triton_support import triton_runs_on

NAME = "omni_fused"
# Rows (tokens) per call up to which the fused kernels run; above, transformers' grouped_mm.
MAX_FUSED_ROWS = 16


@dataclass(frozen=True)
class LaunchConfig:
    """Block sizes of the two kernels (a program's share of the work) and warps per program."""

    gate_rows: int  # intermediate units per gate_up program (its gate and its up rows each)
    gate_cols: int  # hidden columns per inner step of gate_up
    down_rows: int  # hidden units per down program
    down_cols: int  # intermediate columns per inner step of down
    warps: int = 4


def launch_config(rows: int, hidden: int, intermediate: int, top_k: int) -> LaunchConfig:
    """Block sizes for ``rows`` tokens routed to ``top_k`` experts each. One shape serves every
    row count up to ``MAX_FUSED_ROWS``: on an H200 at the Qwen3-Omni-30B-A3B thinker's experts
    (H=2048, I=768, top-8) it was within 4% of the best of twelve configurations at 1 to 16 rows
    and 1.7-2.5x faster than grouped_mm (``bench.moe_kernel``, docs/benchmarks.md). Small gate
    blocks give many programs (a matrix-vector product is bound by the loads in flight); the inner
    tiles are wide enough for 16-byte loads."""
    del rows, top_k  # the measured shape did not depend on them
    return LaunchConfig(
        gate_rows=8,
        gate_cols=min(512, _pow2_at_least(hidden)),
        down_rows=4,
        down_cols=min(256, _pow2_at_least(intermediate)),
    )


def _pow2_at_least(n: int) -> int:
    return 1 << max(4, (n - 1).bit_length())


def register() -> None:
    """Make ``omni_fused`` a valid ``config._experts_implementation`` in transformers."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(NAME, fused_experts_forward)


def fusable(experts: Any, hidden_states: torch.Tensor) -> bool:
    """Whether this experts module and input take the fused path (else: grouped_mm)."""
    return (
        hidden_states.dim() == 2
        and hidden_states.size(0) <= MAX_FUSED_ROWS
        and fusable_experts(experts)
        and triton_runs_on(hidden_states)
    )


def fusable_experts(experts: Any) -> bool:
    """Whether this experts module has the layout the kernels read: gate and up concatenated
    [E, 2I, H], down [E, H, I], no biases, SiLU, all experts in this process."""
    return (
        getattr(experts, "has_gate", False)
        and getattr(experts, "is_concatenated", False)
        and not getattr(experts, "has_bias", True)
        and not getattr(experts, "is_transposed", True)
        and not getattr(experts, "has_post_expert_norm", True)
        and not getattr(experts, "_is_expert_parallel", True)
        and _is_silu(experts.act_fn)
    )


def fused_experts_forward(
    experts: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """transformers' experts-forward signature: ``hidden_states`` [T, H], ``top_k_index`` and
    ``top_k_weights`` [T, K] -> [T, H]."""
    if not fusable(experts, hidden_states):
        from transformers.integrations.moe import grouped_mm_experts_forward

        return grouped_mm_experts_forward(experts, hidden_states, top_k_index, top_k_weights)
    return fused_experts(hidden_states, top_k_index, top_k_weights, experts.gate_up_proj, experts.down_proj)


def fused_experts(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """The two kernels over rows ``hidden_states`` [T, H] with experts ``gate_up_proj`` [E, 2I, H]
    (gate rows first) and ``down_proj`` [E, H, I]. Without ``config`` the launch goes through the
    ``omni::fused_experts`` operator, so ``torch.compile``d layers keep it as one opaque call (its
    grid depends on the row count, which dynamo traces symbolically)."""
    hidden = hidden_states.size(-1)
    intermediate = down_proj.size(-1)
    if gate_up_proj.shape[1:] != (2 * intermediate, hidden) or down_proj.shape[1] != hidden:
        raise ValueError(
            f"expert shapes gate_up {tuple(gate_up_proj.shape)} and down {tuple(down_proj.shape)} "
            f"do not match hidden size {hidden}"
        )
    if config is None:
        return _fused_experts_op(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj)
    return _launch(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj, config)


@torch.library.custom_op("omni::fused_experts", mutates_args=())
def _fused_experts_op(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> torch.Tensor:
    rows, hidden = hidden_states.shape
    cfg = launch_config(rows, hidden, down_proj.size(-1), top_k_index.size(-1))
    return _launch(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj, cfg)


@_fused_experts_op.register_fake
def _(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> torch.Tensor:
    return torch.empty_like(hidden_states, memory_format=torch.contiguous_format)


def _launch(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    cfg: LaunchConfig,
) -> torch.Tensor:
    rows, hidden = hidden_states.shape
    top_k = top_k_index.size(-1)
    intermediate = down_proj.size(-1)
    x = hidden_states.contiguous()
    index = top_k_index.reshape(-1).contiguous()
    weights = top_k_weights.reshape(-1).contiguous()
    gate_up = gate_up_proj if gate_up_proj.stride(-1) == 1 else gate_up_proj.contiguous()
    down = down_proj if down_proj.stride(-1) == 1 else down_proj.contiguous()
    act = torch.empty(rows * top_k, intermediate, dtype=x.dtype, device=x.device)
    out = torch.empty_like(x)
    gate_up_kernel, down_kernel = _kernels()
    gate_up_kernel[(rows * top_k, _cdiv(intermediate, cfg.gate_rows))](
        x,
        index,
        gate_up,
        act,
        x.stride(0),
        gate_up.stride(0),
        gate_up.stride(1),
        HIDDEN=hidden,
        INTERMEDIATE=intermediate,
        TOP_K=top_k,
        BLOCK_N=cfg.gate_rows,
        BLOCK_H=cfg.gate_cols,
        PDL=False,
        num_warps=cfg.warps,
    )
    down_kernel[(rows, _cdiv(hidden, cfg.down_rows))](
        act,
        index,
        weights,
        down,
        out,
        down.stride(0),
        down.stride(1),
        out.stride(0),
        HIDDEN=hidden,
        INTERMEDIATE=intermediate,
        TOP_K=top_k,
        BLOCK_D=cfg.down_rows,
        BLOCK_I=cfg.down_cols,
        num_warps=cfg.warps,
    )
    return out


def route(logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' top-k router after its linear: routing weights (``logits``' dtype) and expert
    indices (int64), both [T, top_k], highest first, in one kernel."""
    return _route_op(logits, top_k, normalize)


@torch.library.custom_op("omni::moe_route", mutates_args=())
def _route_op(logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rows, experts = logits.shape
    weights = torch.empty(rows, top_k, dtype=logits.dtype, device=logits.device)
    index = torch.empty(rows, top_k, dtype=torch.long, device=logits.device)
    if rows:
        _route_kernel()[(rows,)](
            logits,
            weights,
            index,
            logits.stride(0),
            EXPERTS=experts,
            BLOCK_E=_pow2_at_least(experts),
            TOP_K=top_k,
            NORMALIZE=normalize,
        )
    return weights, index


@_route_op.register_fake
def _(logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rows = logits.size(0)
    return (
        logits.new_empty(rows, top_k),
        logits.new_empty(rows, top_k, dtype=torch.long),
    )


def router_forward(router: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A fused forward for transformers' ``*TopKRouter`` modules (linear, softmax, top-k,
    renormalise): the same ``(logits, weights, indices)``, the last three steps one kernel."""
    if not triton_runs_on(hidden_states):  # transformers' own forward
        original: Any = _ORIGINAL.get(type(router), type(router))
        return original.forward(router, hidden_states)
    hidden_states = hidden_states.reshape(-1, router.hidden_dim)
    logits = torch.nn.functional.linear(hidden_states, router.weight)
    weights, index = route(logits, router.top_k, router.norm_topk_prob)
    return logits, weights, index


def is_router(module: torch.nn.Module) -> bool:
    """transformers' softmax-then-top-k router (Qwen3-MoE style), the shape ``router_forward`` fuses."""
    return type(module).__name__.endswith("TopKRouter") and all(
        hasattr(module, name) for name in ("top_k", "norm_topk_prob", "hidden_dim", "weight")
    )


def fuse_routers(model: torch.nn.Module, fused: bool) -> int:
    """Give every top-k router of ``model`` the fused forward (or back its own); how many. The
    router's class is swapped for a subclass whose ``forward`` is ``router_forward``, so every
    layer shares one forward and a compiled layer's guards check the router's type, not a
    per-instance forward object."""
    count = 0
    for module in model.modules():
        if fused and is_router(module) and type(module) not in _ORIGINAL:
            module.__class__ = _fused_class(type(module))
            count += 1
        elif type(module) in _ORIGINAL:
            if not fused:
                module.__class__ = _ORIGINAL[type(module)]
            count += 1
    return count


_ORIGINAL: dict[type, type] = {}  # fused router class -> transformers' class
_FUSED: dict[type, type] = {}  # transformers' router class -> its fused subclass


def _fused_class(original: type) -> type:
    if original not in _FUSED:
        fused = type(f"Fused{original.__name__}", (original,), {"forward": router_forward})
        _FUSED[original], _ORIGINAL[fused] = fused, original
    return _FUSED[original]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _is_silu(act: Any) -> bool:
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ in ("SiLUActivation", "SiLU")


@functools.cache
def _kernels() -> tuple[Any, Any]:
    """The Triton kernels, built on first use (Triton is imported only where they run). The expert
    sizes are compile-time constants, so the loops unroll and every weight load of a program can be
    in flight at once (a matrix-vector product is bound by the loads in flight)."""
    from omni_runtime.executor import moe_layer_kernels as kernels

    return kernels.gate_up_kernel, kernels.down_kernel


@functools.cache
def _route_kernel() -> Any:
    """Softmax over a row's router logits, its top-k experts (highest first, the lowest index on a
    tie, as a stable sort) and their weights, renormalised over the k when asked: one program per
    row in place of transformers' softmax, top-k (a gather and a sort kernel) and division. It
    lives beside the fused layer's router, which routes with the same ``route_row``."""
    from omni_runtime.executor import moe_layer_kernels

    return moe_layer_kernels.route_kernel
