"""A decode step's attention reads each key/value head once, compiled or not.

With grouped-query attention (the Qwen2.5-Omni-7B thinker: 28 query heads on 4 key/value heads;
its talker 12 on 2), a one-token query can attend as ``[batch, kv_heads, groups, dim]``: each
group's query heads become the query positions of their key/value head. transformers' SDPA path
does this packing, but not under ``torch.compile``, and the slot decoder compiles its decode
layers. There it fell back to ``repeat_kv``: every layer of every step copied the cache view once
per query head of a group before attending. On an H100 at 16 streams that copy, fused with the
rotary embedding into one kernel, took a third of the thinker's GPU time and a fifth of the
talker's (tests/gpu/gpu_timeline.py).

:func:`use_packed_decode` registers :func:`packed_decode_attention` with transformers' attention
interface and points a decoder stack's attention modules at it. A query of one token with a mask
shared by every head is packed; anything else (prefill, a per-head mask, a position bias) goes to
transformers' SDPA function unchanged.

``OMNI_DECODE_KERNEL=split`` (opt-in) attends with :func:`split_key_attention` instead, a
flash-decoding kernel pair: PyTorch's memory-efficient kernel runs one program per (row, key/value
head), 32 programs for the talker at 16 streams on a GPU of 132 SMs, each walking every key; a
16-stream trace showed its decode attention at 36 µs a layer.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omni_runtime.contract import switches
from omni_runtime.executor.triton_support import triton_runs_on

NAME = "omni_packed_sdpa"
# ``split`` runs the packed query through the split-key Triton kernels below instead of PyTorch's
# SDPA. Off by default: tested under Triton's interpreter, not yet measured on a GPU.
KERNEL: str | None = None  # None: OMNI_DECODE_KERNEL, read when first needed (kernel())
TARGET_PROGRAMS = 256  # about two programs per SM of an H100 or H200 (132 SMs)
BLOCK_N = 32  # keys per loop iteration of a program


def kernel() -> str:
    """``KERNEL``, read from ``OMNI_DECODE_KERNEL`` the first time (a wrong value raises here, in
    the switch's words; `omni serve` refuses it before loading)."""
    global KERNEL
    if KERNEL is None:
        KERNEL = switches.choice("OMNI_DECODE_KERNEL")
    return KERNEL


def packed_decode_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query`` [b, heads, q, d], ``key``/``value``
    [b, kv_heads, kv, d]; returns [b, q, heads, d] (and no weights)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = int(getattr(module, "num_key_value_groups", 1))
    shared_mask = attention_mask is None or attention_mask.shape[1] == 1
    if query.shape[2] != 1 or groups == 1 or not shared_mask or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    batch, heads, _, dim = query.shape
    # Query heads h = k * groups + g attend with key/value head k (transformers' repeat_kv order).
    packed = query.reshape(batch, heads // groups, groups, dim)
    if dropout == 0.0 and split_kernel_fits(packed, key, value, attention_mask):
        mask = None if attention_mask is None else attention_mask[:, 0, 0, :]
        out = split_key_attention(packed, key, value, mask, dim**-0.5 if scaling is None else scaling)
    else:
        out = F.scaled_dot_product_attention(
            packed, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling
        )
    return out.reshape(batch, heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


def split_kernel_fits(
    packed: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None
) -> bool:
    """Whether :func:`split_key_attention` takes this call: on CUDA (or Triton's interpreter),
    a power-of-two head size from 16 to 256 shared by keys and values, unit-stride head dimensions, and a
    boolean key mask shared by every head and query position."""
    dim = packed.shape[-1]
    return (
        kernel() == "split"
        and triton_runs_on(packed)
        and dim == key.shape[-1] == value.shape[-1]
        and 16 <= dim <= 256
        and dim & (dim - 1) == 0
        and packed.shape[2] <= 64
        and packed.stride(-1) == key.stride(-1) == value.stride(-1) == 1
        and (
            mask is None
            or (mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1] == mask.shape[2] == 1)
        )
    )


def split_plan(
    rows: int, kv_heads: int, length: int, *, programs: int = TARGET_PROGRAMS, least_blocks: int = 1
) -> tuple[int, int]:
    """(splits, keys per split) for ``rows`` x ``kv_heads`` programs over ``length`` keys: enough
    splits that about ``programs`` programs run, each over whole ``BLOCK_N`` blocks, at least
    ``least_blocks`` of them (executor.moe_layer's attention asks for fewer, longer splits)."""
    blocks = max(1, -(-length // BLOCK_N))
    wanted = max(1, -(-programs // max(1, rows * kv_heads)))
    per_split = max(least_blocks, -(-blocks // min(blocks, wanted)))  # blocks a split covers
    return -(-blocks // per_split), per_split * BLOCK_N


def split_key_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """Attention of ``query`` [b, kv_heads, q, d] (q: one token's packed query heads) over ``key``
    and ``value`` [b, kv_heads, L, d] (strided views of a cache) where ``mask`` [b or 1, L] is
    true, as flash-decoding does it: the keys are cut into splits, one program per (row, head,
    split) computes a partial softmax, and a second kernel combines the splits. A decode step
    has few (row, head) pairs, so one program per pair (PyTorch's memory-efficient kernel) left
    most SMs idle while it walked the keys."""
    return torch.ops.omni.decode_attention(query, key, value, mask, scale)


@torch.library.custom_op("omni::decode_attention", mutates_args=())
def _decode_attention_op(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    rows, kv_heads, groups, dim = query.shape
    length = key.shape[2]
    splits, per_split = split_plan(rows, kv_heads, length)
    block_g = max(16, 1 << (groups - 1).bit_length())
    pairs = rows * kv_heads
    m = torch.empty(pairs, splits, block_g, dtype=torch.float32, device=query.device)
    denominators = torch.empty_like(m)
    partial = torch.empty(pairs, splits, block_g, dim, dtype=torch.float32, device=query.device)
    out = torch.empty(rows, kv_heads, groups, dim, dtype=query.dtype, device=query.device)
    if mask is not None:
        bits = mask.view(torch.uint8)
        mask_rows = 0 if bits.shape[0] == 1 else bits.stride(0)
        mask_keys = bits.stride(1)
    else:
        bits, mask_rows, mask_keys = query, 0, 0  # never read
    partial_kernel, combine_kernel = _kernels()
    partial_kernel[(pairs, splits)](
        query, key, value, bits, m, denominators, partial,
        query.stride(0), query.stride(1), query.stride(2),
        key.stride(0), key.stride(1), key.stride(2),
        value.stride(0), value.stride(1), value.stride(2),
        mask_rows, mask_keys,
        kv_heads, length, per_split, splits, scale,
        GROUPS=groups, DIM=dim, BLOCK_G=block_g, BLOCK_N=BLOCK_N, HAS_MASK=mask is not None,
    )  # fmt: skip
    combine_kernel[(pairs,)](
        m, denominators, partial, out,
        out.stride(0), out.stride(1), out.stride(2), kv_heads, splits,
        GROUPS=groups, DIM=dim, BLOCK_G=block_g,
    )  # fmt: skip
    return out


@_decode_attention_op.register_fake
def _(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    return torch.empty_like(query, memory_format=torch.contiguous_format)


@functools.cache
def _kernels() -> tuple[Any, Any]:
    """The two Triton kernels (``attention_kernels``), imported on first use: Triton is imported
    only where they run."""
    from omni_runtime.executor import attention_kernels

    return attention_kernels.partial_kernel, attention_kernels.combine_kernel


def register() -> None:
    """Make ``NAME`` an attention implementation transformers knows (idempotent): the function,
    and SDPA's mask format for code that builds masks from a config naming it."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(NAME, packed_decode_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def use_packed_decode(layers: nn.Module) -> int:
    """Point every grouped-query attention module under ``layers`` that uses SDPA at
    :func:`packed_decode_attention`; returns how many configs changed (each module reads its
    implementation from its config at every forward)."""
    register()
    changed: set[int] = set()
    for module in layers.modules():
        config = getattr(module, "config", None)
        if getattr(module, "num_key_value_groups", 1) <= 1 or config is None:
            continue
        if getattr(config, "_attn_implementation", None) == "sdpa":
            config._attn_implementation = NAME
            changed.add(id(config))
    return len(changed)
