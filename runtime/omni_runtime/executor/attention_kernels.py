"""The split-key attention kernels of a decode step, and the two steps every such kernel shares.

``softmax_step`` folds one block of keys into a running (maximum, denominator, value sum) of a
group of query heads; ``merge_split`` folds one split's partial result into another. The
flash-decoding pair of executor.decode_attention (``partial_kernel``: a split's partial softmax;
``combine_kernel``: the splits merged) is built from them, and so is the fused MoE layer's
attention (executor.moe_layer_kernels). Imported only where they run: Triton is imported at the
top of this module.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def softmax_step(query, keys, values, ok, m_i, l_i, acc, scale):
    """One block of keys (``ok``: the keys that count) folded into the running maximum ``m_i``,
    denominator ``l_i`` and value sum ``acc`` of ``query``'s heads (online softmax)."""
    scores = tl.dot(query, tl.trans(keys)).to(tl.float32) * scale
    scores = tl.where(ok[None, :], scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: nothing to scale
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(scores - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(values.dtype), values).to(tl.float32)
    return m_new, l_i, acc


@triton.jit
def merge_split(m, total, acc, m_s, l_s, part):
    """A split's partial softmax (maximum ``m_s``, denominator ``l_s``, value sum ``part``) merged
    into the running ``m``, ``total`` and ``acc``."""
    m_new = tl.maximum(m, m_s)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    old = tl.exp(m - m_safe)
    new = tl.exp(m_s - m_safe)
    return m_new, total * old + l_s * new, acc * old[:, None] + part * new[:, None]


# The sizes that change with the (batch, length) bucket are plain arguments, not specialised:
# one compile per stack serves every CUDA graph the slot decoder captures.
@triton.jit(do_not_specialize=["length", "per_split", "splits", "stride_mb"])
def partial_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
    stride_qb, stride_qh, stride_qg,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_mb, stride_mn,
    kv_heads, length, per_split, splits, scale,
    GROUPS: tl.constexpr, DIM: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr, HAS_MASK: tl.constexpr,
):  # fmt: skip
    """A (row, key/value head, split)'s partial softmax over its keys where the mask allows."""
    pair = tl.program_id(0)
    split = tl.program_id(1)
    row = pair // kv_heads
    head = pair % kv_heads
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, DIM)
    q_ptrs = q_ptr + row * stride_qb + head * stride_qh + g[:, None] * stride_qg + d[None, :]
    q = tl.load(q_ptrs, mask=g[:, None] < GROUPS, other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, DIM], tl.float32)
    start = split * per_split
    end = tl.minimum(start + per_split, length)
    k_base = k_ptr + row * stride_kb + head * stride_kh
    v_base = v_ptr + row * stride_vb + head * stride_vh
    for first in range(start, end, BLOCK_N):
        n = first + tl.arange(0, BLOCK_N)
        inside = n < end
        ok = inside
        if HAS_MASK:
            ok = ok & (tl.load(mask_ptr + row * stride_mb + n * stride_mn, mask=inside, other=0) != 0)
        k = tl.load(k_base + n[:, None] * stride_kn + d[None, :], mask=inside[:, None], other=0.0)
        v = tl.load(v_base + n[:, None] * stride_vn + d[None, :], mask=inside[:, None], other=0.0)
        m_i, l_i, acc = softmax_step(q, k, v, ok, m_i, l_i, acc, scale)
    at = pair * splits + split
    tl.store(m_ptr + at * BLOCK_G + g, m_i)
    tl.store(l_ptr + at * BLOCK_G + g, l_i)
    tl.store(acc_ptr + (at * BLOCK_G + g[:, None]) * DIM + d[None, :], acc)


@triton.jit(do_not_specialize=["splits"])
def combine_kernel(
    m_ptr, l_ptr, acc_ptr, out_ptr,
    stride_ob, stride_oh, stride_og, kv_heads, splits,
    GROUPS: tl.constexpr, DIM: tl.constexpr, BLOCK_G: tl.constexpr,
):  # fmt: skip
    """A (row, key/value head)'s splits merged into its output."""
    pair = tl.program_id(0)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, DIM)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, DIM], tl.float32)
    for split in range(splits):
        at = pair * splits + split
        m_s = tl.load(m_ptr + at * BLOCK_G + g)
        l_s = tl.load(l_ptr + at * BLOCK_G + g)
        part = tl.load(acc_ptr + (at * BLOCK_G + g[:, None]) * DIM + d[None, :])
        m, total, acc = merge_split(m, total, acc, m_s, l_s, part)
    out = acc / tl.where(total == 0.0, 1.0, total)[:, None]  # a row with no key at all: zeros
    row = pair // kv_heads
    head = pair % kv_heads
    out_ptrs = out_ptr + row * stride_ob + head * stride_oh + g[:, None] * stride_og + d[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=g[:, None] < GROUPS)
