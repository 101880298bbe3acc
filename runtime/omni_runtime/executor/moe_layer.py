"""A Qwen3-MoE decoder layer's decode step in six kernels (issue 17: decode at batch 1).

At batch 1 a decode step is bound by the bytes of weights it reads, and the Qwen3-Omni-30B-A3B
thinker reads only 113 MB a layer (attention 38 MB, the 8 routed experts 75 MB): at 4.8 TB/s
that is 24 µs, about what a dozen small kernels cost in launch gaps, ramps and tails alone. The
compiled transformers layer ran about 15 kernels a layer (the norms, the q/k/v GEMM, the q and k
norms with the rotary embedding, the cache write, attention, the o GEMM and residual, the second
norm, the router's GEMM and top-k, the experts' two kernels, the residual). Here a layer is six
(``moe_layer_kernels``):

1. ``gemv`` with the input norm: the fused q/k/v projection of the normed rows;
2. ``attention``: the q and k norms, the rotary embedding and the cache write of the new key and
   value, then split-key attention over the cache, the splits combined by the last program;
3. ``gemv`` with the residual: the o projection added to the layer's input;
4. ``router``: the post-attention norm (its rows stored for the experts), the router's logits,
   and in the last program the routing (softmax, top-k, renormalisation);
5. ``gate_up`` (moe_decode's): ``silu(gate) * up`` for a block of a routed expert's units;
6. ``experts_down``: each program reads its row's experts' down rows, then the gate-up
   activations, and adds the routing-weighted sum to the residual.

A step of one row on Hopper or later ends with one CUDA kernel instead of the last three
(``moe_experts``: the router and both halves of the experts, the down rows copied into shared
memory while the gate and up rows stream, no kernel boundary between them; ``OMNI_MOE_ROW_KERNEL``),
and its o projection is a CUDA kernel too (``row_gemv``: its rows copied into shared memory while
the attention runs).

Each kernel reads what does not depend on the kernel just before it (weights, the routing two
kernels back, the residual) before it waits for that kernel, so with programmatic dependent
launch (``PDL``, Hopper; ``OMNI_MOE_LAYER=pdl``) those loads stream while the previous kernel
drains. The layer takes decode steps of up to ``MAX_ROWS`` rows over a
``SlotKVCache`` (rows ``0..b-1`` in slots ``0..b-1``, written at ``write_pos``, keys up to it
read); anything else (prefill, larger batches, CPU without Triton's interpreter) goes to the
layer it wraps. The kernels round where transformers rounds (each norm, projection and residual
in the model's dtype) and accumulate in float32.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from omni_runtime.contract import switches
from omni_runtime.executor import decode_attention, moe_decode, moe_experts, row_gemv
from omni_runtime.executor.triton_support import triton_runs_on

MAX_ROWS = 4  # decode rows the fused layer takes; above, the wrapped (compiled) layer
BLOCK_N = decode_attention.BLOCK_N  # cached keys per attention loop step
# Launch shapes, from tests/gpu/sweep_moe_layer.py on an H200 (docs/benchmarks.md).
GEMV_ROWS = 8  # weight rows (outputs) per matrix-vector program
GEMV_WARPS = 8
ROUTER_WARPS = 1
ATTENTION_WARPS = 8
EXPERTS: moe_decode.LaunchConfig | None = None  # the gate-up kernel's blocks (None: experts_shape)
# Gate-up blocks of 4 units x 1024 columns on 4 warps for every row count up to MAX_ROWS (on an
# H200 in one call, ms a step at batch 1 / 2 / 4: 2.598 / 3.766 / 6.137 against 2.607-2.653 /
# 3.863-3.893 / 6.201-6.241 with the blocks before, moe_decode's from one row and 16 x 1024 on 8
# warps from two; docs/benchmarks.md).
LAYER_EXPERTS = moe_decode.LaunchConfig(gate_rows=4, gate_cols=1024, down_rows=4, down_cols=256, warps=4)
DOWN_ROWS = 2  # hidden units per down program (it holds its experts' rows: TOP_K x DOWN_ROWS x I)
DOWN_WARPS = 4
ROUTER_EXPERTS = 2  # router rows per router program
KEYS_PER_SPLIT = 64  # least cached keys one attention program walks
ATTENTION_PROGRAMS = 128  # attention programs wanted in all (rows x key/value heads x splits)
MAX_SPLITS = 16  # splits a (row, key/value head) pair at most: the last one merges them in turn
# One row with the MoE kernel: the o projection by row_gemv.cu (its rows copied into shared memory
# during the attention) instead of the Triton matrix-vector kernel.
ROW_O = True
MERGE_CHUNK = 4  # splits the attention's last program merges a round (their loads in flight together)


@dataclass(frozen=True)
class MoeLayerWeights:
    """What one Qwen3-MoE decoder layer's decode step reads (views of the module's parameters)."""

    input_norm: torch.Tensor  # [H]
    qkv: torch.Tensor  # [(heads + 2 kv_heads) * head_dim, H]: q rows, then k, then v
    q_norm: torch.Tensor  # [head_dim]
    k_norm: torch.Tensor  # [head_dim]
    o_proj: torch.Tensor  # [H, heads * head_dim]
    post_norm: torch.Tensor  # [H]
    router: torch.Tensor  # [E, H]
    gate_up: torch.Tensor  # [E, 2I, H]
    down: torch.Tensor  # [E, H, I]
    heads: int
    kv_heads: int
    head_dim: int
    top_k: int
    normalize: bool
    eps: float
    qk_eps: float
    scaling: float

    def check(self) -> None:
        """Shapes that agree with each other, or a ValueError naming the one that does not."""
        hidden = self.input_norm.shape[0]
        width = (self.heads + 2 * self.kv_heads) * self.head_dim
        expected = {
            "qkv": (width, hidden),
            "o_proj": (hidden, self.heads * self.head_dim),
            "q_norm": (self.head_dim,),
            "k_norm": (self.head_dim,),
            "post_norm": (hidden,),
            "router": (self.router.shape[0], hidden),
            "gate_up": (self.router.shape[0], 2 * self.down.shape[-1], hidden),
            "down": (self.router.shape[0], hidden, self.down.shape[-1]),
        }
        for name, shape in expected.items():
            if tuple(getattr(self, name).shape) != shape:
                raise ValueError(f"{name} is {tuple(getattr(self, name).shape)}, expected {shape}")
        if self.gate_up.stride(-1) != 1 or self.down.stride(-1) != 1:
            raise ValueError("gate_up and down must be contiguous in their last dimension")
        if self.heads % self.kv_heads or self.head_dim & (self.head_dim - 1) or self.head_dim < 16:
            raise ValueError(f"heads {self.heads}/{self.kv_heads} of {self.head_dim}: unsupported")


class FusedMoeDecodeLayer:
    """A decoder layer's callable for the slot decoder's decode step: the six kernels where they
    apply (``takes``), else ``fallback`` (the compiled or eager transformers layer)."""

    def __init__(self, weights: MoeLayerWeights, fallback: Callable[..., Any], *, pdl: bool = False) -> None:
        weights.check()
        self.weights, self.fallback, self.pdl = weights, fallback, pdl
        device = weights.qkv.device
        # Zero between uses: each kernel's last program resets what it counted.
        self.attention_count = torch.zeros(MAX_ROWS * weights.kv_heads, dtype=torch.int32, device=device)
        self.router_count = torch.zeros(1, dtype=torch.int32, device=device)
        # Each program's global-timer marks when set (trace_buffer; tests/gpu/layer_phases.py)
        self.trace: torch.Tensor | None = None
        self.row: moe_experts.RowExperts | None = None
        self.row_o: row_gemv.RowGemv | None = None
        if switches.flag("OMNI_MOE_ROW_KERNEL"):
            self.row = moe_experts.row_experts(
                post_norm=weights.post_norm, router=weights.router, gate_up=weights.gate_up, down=weights.down,
                top_k=weights.top_k, normalize=weights.normalize, eps=weights.eps,
            )  # fmt: skip
            if self.row is not None and ROW_O:
                self.row_o = row_gemv.row_gemv(weights.o_proj)

    def takes(self, hidden: torch.Tensor, cache: Any) -> bool:
        return (
            hidden.dim() == 3
            and hidden.shape[1] == 1
            and hidden.shape[0] <= MAX_ROWS
            and getattr(cache, "prefill_slots", 0) is None
            and getattr(cache, "layer_keys", None) is not None
            and triton_runs_on(hidden)
        )

    def __call__(
        self,
        hidden: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if position_embeddings is None or not self.takes(hidden, past_key_values):
            return self.fallback(  # type: ignore[no-any-return]
                hidden,
                attention_mask=attention_mask,
                position_embeddings=position_embeddings,
                past_key_values=past_key_values,
                **kwargs,
            )
        cache = past_key_values
        out = decode_step(
            self,
            hidden[:, 0],
            position_embeddings,
            cache.layer_keys,
            cache.layer_values,
            cache.write_pos,
            cache.view_len,
        )
        return out[:, None]


def trace_buffer(device: torch.device | str, programs: int = 8192) -> torch.Tensor:
    """Zeros for ``FusedMoeDecodeLayer.trace``: [6 kernels, programs, marks a program] int64 (a
    layer's largest grid at ``MAX_ROWS`` rows of the released thinker is 6,144 gate-up programs)."""
    marks = _kernels().TRACE_MARKS.value
    return torch.zeros(6, programs, marks, dtype=torch.int64, device=device)


def split_plan(rows: int, kv_heads: int, view: int) -> tuple[int, int]:
    """(splits, keys per split) of the attention over ``view`` cached positions
    (decode_attention.split_plan): about ``ATTENTION_PROGRAMS`` programs in all but at most
    ``MAX_SPLITS`` a pair, each over a whole number of ``BLOCK_N`` blocks and at least
    ``KEYS_PER_SPLIT`` keys."""
    least = -(-KEYS_PER_SPLIT // BLOCK_N)
    programs = min(ATTENTION_PROGRAMS, MAX_SPLITS * rows * kv_heads)
    return decode_attention.split_plan(rows, kv_heads, view, programs=programs, least_blocks=least)


def experts_shape() -> moe_decode.LaunchConfig:
    """The gate-up kernel's blocks: ``EXPERTS`` if set (a sweep's override), else ``LAYER_EXPERTS``."""
    return EXPERTS if EXPERTS is not None else LAYER_EXPERTS


def decode_step(
    layer: FusedMoeDecodeLayer,
    hidden: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    keys: torch.Tensor,
    values: torch.Tensor,
    write_pos: torch.Tensor,
    view: int,
) -> torch.Tensor:
    """One layer for ``hidden`` [b, H] (b <= MAX_ROWS): the layer's output [b, H]."""
    w = layer.weights
    k = _kernels()
    rows, size = hidden.shape
    padded = 1 << (rows - 1).bit_length()
    dtype, device = hidden.dtype, hidden.device
    x = hidden.contiguous()
    cos, sin = (t.reshape(t.shape[0], -1)[:, -w.head_dim :] for t in position_embeddings)
    pdl = {"launch_pdl": True} if layer.pdl else {}
    trace = layer.trace

    def marks(kernel: int) -> dict[str, Any]:
        return {} if trace is None else {"trace_ptr": trace[kernel], "TRACE": True}

    width = w.qkv.shape[0]
    qkv = torch.empty(rows, width, dtype=dtype, device=device)
    k.gemv_kernel[(_cdiv(width, GEMV_ROWS),)](
        x, w.input_norm, w.qkv, x, qkv,
        rows, x.stride(0), w.qkv.stride(0), 0, qkv.stride(0), w.eps,
        K=size, K_PAD=_pow2(size), N=width, ROWS=padded, BLOCK_N=GEMV_ROWS,
        HAS_NORM=True, HAS_RES=False, PDL=layer.pdl, num_warps=GEMV_WARPS, **pdl, **marks(0),
    )  # fmt: skip
    groups = w.heads // w.kv_heads
    block_g = max(16, _pow2(groups))
    splits, per_split = split_plan(rows, w.kv_heads, view)
    output = (k.OUTPUT_DIRECT if splits == 1 else k.OUTPUT_MERGED).value
    pairs = rows * w.kv_heads
    m = torch.empty(pairs, splits, block_g, dtype=torch.float32, device=device)
    denominators = torch.empty_like(m)
    partial = torch.empty(pairs, splits, block_g, w.head_dim, dtype=torch.float32, device=device)
    attended = torch.empty(rows, w.heads * w.head_dim, dtype=dtype, device=device)
    k.attention_kernel[(pairs, splits)](
        qkv, w.q_norm, w.k_norm, cos, sin, keys, values, write_pos,
        m, denominators, partial, layer.attention_count, attended,
        qkv.stride(0), cos.stride(0), sin.stride(0), keys.stride(0), keys.stride(1), keys.stride(2),
        attended.stride(0), splits, per_split, w.scaling, w.qk_eps,
        KV_HEADS=w.kv_heads, GROUPS=groups, DIM=w.head_dim, BLOCK_G=block_g, BLOCK_N=BLOCK_N,
        PDL=layer.pdl, OUTPUT=output, MERGE_CHUNK=MERGE_CHUNK, num_warps=ATTENTION_WARPS, **pdl, **marks(1),
    )  # fmt: skip
    if rows == 1 and layer.row_o is not None:  # set only beside the one-row MoE kernel
        mid = layer.row_o(attended, x, pdl=layer.pdl, trace=None if trace is None else trace[2])
    else:
        mid = torch.empty_like(x)
        k.gemv_kernel[(_cdiv(size, GEMV_ROWS),)](
            attended, w.input_norm, w.o_proj, x, mid,
            rows, attended.stride(0), w.o_proj.stride(0), x.stride(0), mid.stride(0), w.eps,
            K=w.o_proj.shape[1], K_PAD=_pow2(w.o_proj.shape[1]), N=size, ROWS=padded, BLOCK_N=GEMV_ROWS,
            HAS_NORM=False, HAS_RES=True, PDL=layer.pdl, num_warps=GEMV_WARPS, **pdl, **marks(2),
        )  # fmt: skip
    if rows == 1 and layer.row is not None:
        return layer.row(mid, pdl=layer.pdl, trace=None if trace is None else trace[3])
    experts = w.router.shape[0]
    e_pad = _pow2(experts)
    block_e = min(ROUTER_EXPERTS, e_pad)
    programs = e_pad // block_e
    normed = torch.empty_like(x)
    logits = torch.empty(rows, e_pad, dtype=torch.float32, device=device)
    weights = torch.empty(rows, w.top_k, dtype=dtype, device=device)
    index = torch.empty(rows, w.top_k, dtype=torch.int64, device=device)
    k.router_kernel[(programs,)](
        mid, w.post_norm, w.router, normed, logits, layer.router_count, weights, index,
        rows, mid.stride(0), normed.stride(0), w.eps,
        HIDDEN=size, K_PAD=_pow2(size), EXPERTS=experts, E_PAD=e_pad, ROWS=padded, BLOCK_E=block_e,
        PROGRAMS=programs, TOP_K=w.top_k, NORMALIZE=w.normalize, PDL=layer.pdl,
        num_warps=ROUTER_WARPS, **pdl, **marks(3),
    )  # fmt: skip
    intermediate = w.down.shape[-1]
    shape = experts_shape()
    act = torch.empty(rows * w.top_k, intermediate, dtype=dtype, device=device)
    k.gate_up_kernel[(rows * w.top_k, _cdiv(intermediate, shape.gate_rows))](
        normed, index, w.gate_up, act, normed.stride(0), w.gate_up.stride(0), w.gate_up.stride(1),
        HIDDEN=size, INTERMEDIATE=intermediate, TOP_K=w.top_k, BLOCK_N=shape.gate_rows,
        BLOCK_H=shape.gate_cols, PDL=layer.pdl, num_warps=shape.warps, **pdl, **marks(4),
    )  # fmt: skip
    out = torch.empty_like(x)
    k.experts_down_kernel[(rows, _cdiv(size, DOWN_ROWS))](
        act, index, weights, w.down, mid, out,
        w.down.stride(0), w.down.stride(1), mid.stride(0), out.stride(0),
        HIDDEN=size, INTERMEDIATE=intermediate, I_PAD=_pow2(intermediate), TOP_K=w.top_k,
        K_PAD=_pow2(w.top_k), BLOCK_D=DOWN_ROWS, PDL=layer.pdl, num_warps=DOWN_WARPS, **pdl, **marks(5),
    )  # fmt: skip
    return out


@functools.cache
def _kernels() -> Any:
    from omni_runtime.executor import moe_layer_kernels

    return moe_layer_kernels


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)
