"""The Triton kernels of the MoE decode paths: the fused decode layer's six (executor.moe_layer) and
the experts and route kernels of executor.moe_decode. Imported only where they run, since Triton
is imported at the top of this module.

The layer's matrix-vector kernels take ``ROWS`` (the decode batch, a power of two up to
``moe_layer.MAX_ROWS``) as a compile-time constant and loop over it, so they read each weight once
for every row. With ``PDL`` each of the layer's kernels is launched as a programmatic dependent of
the one before it (Hopper): it starts while its predecessor drains, issues the loads that do not
depend on it (its weights; the down kernel also its routing and residual, the attention its first
cached keys), and waits (``gdc_wait``) only before it reads the predecessor's output.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from omni_runtime.executor.attention_kernels import merge_split, softmax_step
from omni_runtime.executor.decode_input_kernels import rms_normed

TRACE_MARKS = tl.constexpr(8)  # marks a program when traced (``mark``)


@triton.jit
def _now():
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def mark(trace_ptr, program, at: tl.constexpr, TRACE: tl.constexpr):
    """With ``TRACE`` (tests/gpu/layer_phases.py), the GPU's global timer in ns at
    ``trace[program, at]`` (``TRACE_MARKS`` a program: 0 entry, 1 past the wait, 2-4 the kernel's
    own phases, 5 done). Without, nothing: the served kernels compile as before."""
    if TRACE:
        tl.store(trace_ptr + program * TRACE_MARKS + at, _now())


@triton.jit
def route_row(logit, lanes, ok, weights_ptr, index_ptr, TOP_K: tl.constexpr, NORMALIZE: tl.constexpr):
    """transformers' top-k routing of one row's router logits (``ok``: the real experts' lanes):
    softmax, the top ``TOP_K`` (highest first, the lowest index on a tie, as a stable sort), their
    weights renormalised over the k when asked, stored at ``weights_ptr``/``index_ptr``[0..k).
    (``k`` rounds of argmax: on an H200 a one-comparison pairwise rank of 128 experts was slower.)"""
    e = tl.exp(logit - tl.max(logit, axis=0))
    prob = e / tl.sum(e, axis=0)
    left = tl.where(ok, prob, -1.0)  # padding lanes are never picked
    rank = tl.full(lanes.shape, -1, tl.int32)
    for k in tl.static_range(TOP_K):
        best = tl.argmax(left, axis=0, tie_break_left=True)
        rank = tl.where(lanes == best, k, rank)
        left = tl.where(lanes == best, -2.0, left)
    chosen = rank >= 0
    weight = prob
    if NORMALIZE:
        weight = prob / tl.sum(tl.where(chosen, prob, 0.0), axis=0)
    tl.store(weights_ptr + rank, weight.to(weights_ptr.dtype.element_ty), mask=chosen)
    tl.store(index_ptr + rank, lanes.to(tl.int64), mask=chosen)


@triton.jit
def route_kernel(
    logits_ptr, weights_ptr, index_ptr, stride_l,
    EXPERTS: tl.constexpr, BLOCK_E: tl.constexpr, TOP_K: tl.constexpr, NORMALIZE: tl.constexpr,
):  # fmt: skip
    """One program per row of router logits (executor.moe_decode.route)."""
    row = tl.program_id(0)
    lanes = tl.arange(0, BLOCK_E)
    ok = lanes < EXPERTS
    logit = tl.load(logits_ptr + row * stride_l + lanes, mask=ok, other=-float("inf")).to(tl.float32)
    route_row(logit, lanes, ok, weights_ptr + row * TOP_K, index_ptr + row * TOP_K, TOP_K, NORMALIZE)


@triton.jit
def gemv_kernel(
    x_ptr, norm_ptr, w_ptr, res_ptr, out_ptr,
    rows, stride_x, stride_w, stride_res, stride_out, eps,
    K: tl.constexpr, K_PAD: tl.constexpr, N: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_NORM: tl.constexpr, HAS_RES: tl.constexpr, PDL: tl.constexpr, trace_ptr=None, TRACE: tl.constexpr = False,
):  # fmt: skip
    """``out[t] = (res[t] +) W @ (rmsnorm(x[t]) or x[t])`` for a block of ``BLOCK_N`` outputs."""
    mark(trace_ptr, tl.program_id(0), 0, TRACE)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    k = tl.arange(0, K_PAD)
    k_ok = k < K
    # The weights first: they do not depend on the kernel before (PDL overlaps them with its tail).
    w = tl.load(w_ptr + n[:, None] * stride_w + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    gain = tl.zeros([K_PAD], tl.float32)
    if HAS_NORM:
        gain = tl.load(norm_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    mark(trace_ptr, tl.program_id(0), 1, TRACE)
    r = tl.arange(0, ROWS)
    acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
    for t in tl.static_range(ROWS):
        x = tl.load(x_ptr + t * stride_x + k, mask=k_ok & (k * 0 + t < rows), other=0.0).to(tl.float32)
        if HAS_NORM:
            rstd = tl.rsqrt(tl.sum(x * x, axis=0) / K + eps)
            x = rms_normed(x, gain, rstd, x_ptr.dtype.element_ty)
        y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        acc = tl.where(r[:, None] == t, y[None, :], acc)
    out = acc.to(out_ptr.dtype.element_ty)
    ok = (r < rows)[:, None] & n_ok[None, :]
    if HAS_RES:
        res = tl.load(res_ptr + r[:, None] * stride_res + n[None, :], mask=ok, other=0.0)
        out = (res.to(tl.float32) + out.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + r[:, None] * stride_out + n[None, :], out, mask=ok)
    mark(trace_ptr, tl.program_id(0), 5, TRACE)


@triton.jit
def router_kernel(
    h_ptr, norm_ptr, w_ptr, xn_ptr, logits_ptr, count_ptr, weights_ptr, index_ptr,
    rows, stride_h, stride_xn, eps,
    HIDDEN: tl.constexpr, K_PAD: tl.constexpr, EXPERTS: tl.constexpr, E_PAD: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_E: tl.constexpr, PROGRAMS: tl.constexpr, TOP_K: tl.constexpr,
    NORMALIZE: tl.constexpr, PDL: tl.constexpr, trace_ptr=None, TRACE: tl.constexpr = False,
):  # fmt: skip
    """The MoE block's post-attention norm and router: each program normalises every row, stores
    its share of the normed rows (``xn``, the experts' input) and the logits of ``BLOCK_E``
    experts; the last program to finish (a counter it resets) routes each row (``route_row``)."""
    pid = tl.program_id(0)
    mark(trace_ptr, pid, 0, TRACE)
    e = pid * BLOCK_E + tl.arange(0, BLOCK_E)
    e_ok = e < EXPERTS
    k = tl.arange(0, K_PAD)
    k_ok = k < HIDDEN
    w = tl.load(w_ptr + e[:, None] * HIDDEN + k[None, :], mask=e_ok[:, None] & k_ok[None, :], other=0.0)
    gain = tl.load(norm_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    mark(trace_ptr, pid, 1, TRACE)
    share = (k // (K_PAD // PROGRAMS)) == pid  # the columns of xn this program stores
    for t in tl.static_range(ROWS):
        if t < rows:
            x = tl.load(h_ptr + t * stride_h + k, mask=k_ok, other=0.0).to(tl.float32)
            rstd = tl.rsqrt(tl.sum(x * x, axis=0) / HIDDEN + eps)
            x = rms_normed(x, gain, rstd, h_ptr.dtype.element_ty)
            tl.store(xn_ptr + t * stride_xn + k, x.to(xn_ptr.dtype.element_ty), mask=k_ok & share)
            logit = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            logit = logit.to(h_ptr.dtype.element_ty).to(tl.float32)  # transformers' linear rounds
            tl.store(logits_ptr + t * E_PAD + e, logit, mask=e_ok)
    mark(trace_ptr, pid, 3, TRACE)
    done = tl.atomic_add(count_ptr, 1, sem="acq_rel")
    mark(trace_ptr, pid, 4, TRACE)
    if done == PROGRAMS - 1:  # every program's logits are visible: route each row
        lanes = tl.arange(0, E_PAD)
        ok = lanes < EXPERTS
        for row in range(rows):
            scores = tl.load(
                logits_ptr + row * E_PAD + lanes, mask=ok, other=-float("inf"), cache_modifier=".cg"
            )
            route_row(scores, lanes, ok, weights_ptr + row * TOP_K, index_ptr + row * TOP_K, TOP_K, NORMALIZE)
        tl.atomic_xchg(count_ptr, 0)
    mark(trace_ptr, pid, 5, TRACE)


@triton.jit
def expert_gate_up(
    x_ptr, w_ptr, act_ptr, expert, token, pair, block, stride_x, stride_we, stride_wn,
    HIDDEN: tl.constexpr, INTERMEDIATE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """``act[pair]`` for a block of ``BLOCK_N`` intermediate units: ``silu(gate) * up`` of row
    ``token`` with ``expert``'s gate and up rows (``w``: [E, 2I, H], gate rows first)."""
    units = block * BLOCK_N + tl.arange(0, BLOCK_N)
    unit_ok = units < INTERMEDIATE
    gate_ptrs = w_ptr + expert * stride_we + units[:, None] * stride_wn
    up_ptrs = gate_ptrs + INTERMEDIATE * stride_wn
    acc_gate = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in tl.static_range(0, HIDDEN, BLOCK_H):
        cols = start + tl.arange(0, BLOCK_H)
        col_ok = cols < HIDDEN
        x = tl.load(x_ptr + token * stride_x + cols, mask=col_ok, other=0.0).to(tl.float32)
        mask = unit_ok[:, None] & col_ok[None, :]
        w_gate = tl.load(gate_ptrs + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        w_up = tl.load(up_ptrs + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        acc_gate += tl.sum(w_gate * x[None, :], axis=1)
        acc_up += tl.sum(w_up * x[None, :], axis=1)
    act = acc_gate / (1.0 + tl.exp(-acc_gate)) * acc_up  # silu(gate) * up
    tl.store(act_ptr + pair * INTERMEDIATE + units, act.to(act_ptr.dtype.element_ty), mask=unit_ok)


@triton.jit
def gate_up_kernel(
    x_ptr, index_ptr, w_ptr, act_ptr, stride_x, stride_we, stride_wn,
    HIDDEN: tl.constexpr, INTERMEDIATE: tl.constexpr, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr, PDL: tl.constexpr, trace_ptr=None, TRACE: tl.constexpr = False,
):  # fmt: skip
    """The experts' first kernel (executor.moe_decode's, and the layer's fifth): program (pair,
    block) runs ``expert_gate_up`` for the pair's expert from ``index`` (the routing)."""
    program = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    mark(trace_ptr, program, 0, TRACE)
    if PDL:  # the routing comes from the kernel before
        gdc_wait()
        gdc_launch_dependents()
    mark(trace_ptr, program, 1, TRACE)
    pair = tl.program_id(0)
    expert = tl.load(index_ptr + pair).to(tl.int64)
    expert_gate_up(
        x_ptr, w_ptr, act_ptr, expert, pair // TOP_K, pair, tl.program_id(1), stride_x, stride_we, stride_wn,
        HIDDEN, INTERMEDIATE, BLOCK_N, BLOCK_H,
    )  # fmt: skip
    mark(trace_ptr, program, 5, TRACE)


@triton.jit
def down_kernel(
    act_ptr, index_ptr, weight_ptr, w_ptr, out_ptr, stride_we, stride_wh, stride_out,
    HIDDEN: tl.constexpr, INTERMEDIATE: tl.constexpr, TOP_K: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_I: tl.constexpr,
):  # fmt: skip
    """executor.moe_decode's second kernel, for a row and ``BLOCK_D`` hidden units: the sum over
    its k experts of the routing weight times the expert's down rows applied to the pair's
    activation. No atomics: a program owns its output block."""
    token = tl.program_id(0)
    units = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    unit_ok = units < HIDDEN
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        pair = token * TOP_K + k
        expert = tl.load(index_ptr + pair).to(tl.int64)
        route = tl.load(weight_ptr + pair).to(tl.float32)
        w_ptrs = w_ptr + expert * stride_we + units[:, None] * stride_wh
        part = tl.zeros([BLOCK_D], dtype=tl.float32)
        for start in tl.static_range(0, INTERMEDIATE, BLOCK_I):
            cols = start + tl.arange(0, BLOCK_I)
            col_ok = cols < INTERMEDIATE
            a = tl.load(act_ptr + pair * INTERMEDIATE + cols, mask=col_ok, other=0.0).to(tl.float32)
            w = tl.load(w_ptrs + cols[None, :], mask=unit_ok[:, None] & col_ok[None, :], other=0.0)
            part += tl.sum(w.to(tl.float32) * a[None, :], axis=1)
        acc += route * part
    tl.store(out_ptr + token * stride_out + units, acc.to(out_ptr.dtype.element_ty), mask=unit_ok)


@triton.jit
def experts_down_kernel(
    act_ptr, index_ptr, weight_ptr, w_ptr, res_ptr, out_ptr, stride_we, stride_wh, stride_res, stride_out,
    HIDDEN: tl.constexpr, INTERMEDIATE: tl.constexpr, I_PAD: tl.constexpr, TOP_K: tl.constexpr,
    K_PAD: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr, trace_ptr=None, TRACE: tl.constexpr = False,
):  # fmt: skip
    """The layer's sixth kernel, for row ``program_id(0)`` and ``BLOCK_D`` hidden units:
    ``res + sum_k weight_k * down[expert_k] @ act[k]``, rounded as transformers' residual add.
    The routing comes from the router kernel, two kernels back (the residual from three), so with
    ``PDL`` the program reads its experts' down rows before it waits for the gate-up kernel's
    ``act``: they stream while that kernel drains."""
    token = tl.program_id(0)
    program = token * tl.num_programs(1) + tl.program_id(1)
    mark(trace_ptr, program, 0, TRACE)
    units = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    unit_ok = units < HIDDEN
    ks = tl.arange(0, K_PAD)
    real = ks < TOP_K
    pairs = token * TOP_K + ks
    experts = tl.load(index_ptr + pairs, mask=real, other=0)
    route = tl.load(weight_ptr + pairs, mask=real, other=0.0).to(tl.float32)
    cols = tl.arange(0, I_PAD)
    col_ok = cols < INTERMEDIATE
    rows = w_ptr + experts[:, None, None] * stride_we + units[None, :, None] * stride_wh + cols[None, None, :]
    w = tl.load(rows, mask=real[:, None, None] & unit_ok[None, :, None] & col_ok[None, None, :], other=0.0)
    res = tl.load(res_ptr + token * stride_res + units, mask=unit_ok, other=0.0).to(tl.float32)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    mark(trace_ptr, program, 1, TRACE)
    a = tl.load(
        act_ptr + pairs[:, None] * INTERMEDIATE + cols[None, :],
        mask=real[:, None] & col_ok[None, :],
        other=0.0,
    )
    part = tl.sum(w.to(tl.float32) * a.to(tl.float32)[:, None, :], axis=2)  # [K_PAD, BLOCK_D]
    out = tl.sum(part * route[:, None], axis=0).to(out_ptr.dtype.element_ty)
    out = (res + out.to(tl.float32)).to(out_ptr.dtype.element_ty)  # transformers' residual + moe
    tl.store(out_ptr + token * stride_out + units, out, mask=unit_ok)
    mark(trace_ptr, program, 5, TRACE)


# How attention_kernel writes its row (its OUTPUT): merged by a pair's last split to finish, or
# by a pair's one split.
OUTPUT_MERGED = tl.constexpr(0)
OUTPUT_DIRECT = tl.constexpr(1)


@triton.jit
def _merged_splits(m_ptr, l_ptr, acc_ptr, pair, splits, g, d, BLOCK_G: tl.constexpr, DIM: tl.constexpr,
                   CHUNK: tl.constexpr):  # fmt: skip
    """A (row, key/value head) pair's ``splits`` partial softmaxes combined, ``CHUNK`` splits a
    round unrolled so that their loads can be in flight together (a split past ``splits``, or one
    with no key: maximum -inf, nothing added): [BLOCK_G, DIM]."""
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_G], tl.float32)
    out = tl.zeros([BLOCK_G, DIM], tl.float32)
    for first in range(0, splits, CHUNK):
        for k in tl.static_range(CHUNK):
            # A split past the last is masked (the mask a vector: the interpreter takes no scalar).
            ok = g * 0 + (first + k) < splits
            at = pair * splits + first + k
            m_s = tl.load(m_ptr + at * BLOCK_G + g, mask=ok, other=float("-inf"), cache_modifier=".cg")
            l_s = tl.load(l_ptr + at * BLOCK_G + g, mask=ok, other=0.0, cache_modifier=".cg")
            part = tl.load(acc_ptr + (at * BLOCK_G + g[:, None]) * DIM + d[None, :], mask=ok[:, None], other=0.0,
                           cache_modifier=".cg")  # fmt: skip
            m, total, out = merge_split(m, total, out, m_s, l_s, part)
    return out / total[:, None]


@triton.jit(do_not_specialize=["splits", "per_split"])
def attention_kernel(
    qkv_ptr, qnorm_ptr, knorm_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, pos_ptr,
    m_ptr, l_ptr, acc_ptr, count_ptr, out_ptr,
    stride_qkv, stride_cos, stride_sin, stride_cb, stride_ch, stride_cn, stride_out,
    splits, per_split, scale, eps,
    KV_HEADS: tl.constexpr, GROUPS: tl.constexpr, DIM: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr, PDL: tl.constexpr, OUTPUT: tl.constexpr = 0, MERGE_CHUNK: tl.constexpr = 1,
    trace_ptr=None, TRACE: tl.constexpr = False,
):  # fmt: skip
    """One decode token's attention for a (row, key/value head) and a split of its cached keys:
    the per-head q and k norms and the rotary embedding of the fused q/k/v projection's output,
    the new key and value written to the cache (split 0) at the row's position, a partial softmax
    over the split's cached keys before that position (split 0 with the new key's term), and, in
    the last split to finish (a counter per pair it resets), the splits combined into the output
    (``softmax_step`` and ``merge_split`` of attention_kernels, as the decode attention's):
    ``OUTPUT_MERGED``; ``OUTPUT_DIRECT`` (one split a pair): the split writes its row itself, with no
    partial and no counter. ``MERGE_CHUNK``: the splits the last program merges a round."""
    pair = tl.program_id(0)
    split = tl.program_id(1)
    program = pair * tl.num_programs(1) + split
    mark(trace_ptr, program, 0, TRACE)
    row = pair // KV_HEADS
    head = pair % KV_HEADS
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, DIM)
    g_ok = g < GROUPS
    rot = (d + DIM // 2) % DIM  # rotate_half: (-x2, x1)
    sign = tl.where(d < DIM // 2, -1.0, 1.0)
    # What does not come from the q/k/v kernel just before: positions, rotary tables, norm weights
    # and the split's first block of cached keys and values, loaded before the wait.
    pos = tl.load(pos_ptr + row).to(tl.int32)
    cos = tl.load(cos_ptr + row * stride_cos + d).to(tl.float32)
    sin = tl.load(sin_ptr + row * stride_sin + d).to(tl.float32)
    wq = tl.load(qnorm_ptr + d).to(tl.float32)
    wq_rot = tl.load(qnorm_ptr + rot).to(tl.float32)
    wk = tl.load(knorm_ptr + d).to(tl.float32)
    wk_rot = tl.load(knorm_ptr + rot).to(tl.float32)
    cache_at = row * stride_cb + head * stride_ch
    start = split * per_split
    end = tl.minimum(start + per_split, pos)
    n = start + tl.arange(0, BLOCK_N)
    inside = n < end
    block_at = cache_at + n[:, None] * stride_cn + d[None, :]
    keys = tl.load(kc_ptr + block_at, mask=inside[:, None], other=0.0)
    values = tl.load(vc_ptr + block_at, mask=inside[:, None], other=0.0)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    mark(trace_ptr, program, 1, TRACE)
    dtype = kc_ptr.dtype.element_ty
    base = qkv_ptr + row * stride_qkv
    # Queries of the group: norm over each head, then the rotary embedding, rounded as transformers.
    q_at = base + (head * GROUPS + g)[:, None] * DIM
    q = tl.load(q_at + d[None, :], mask=g_ok[:, None], other=0.0).to(tl.float32)
    q_rot = tl.load(q_at + rot[None, :], mask=g_ok[:, None], other=0.0).to(tl.float32)
    q_rstd = tl.rsqrt(tl.sum(q * q, axis=1) / DIM + eps)
    qn = ((q * q_rstd[:, None]).to(dtype).to(tl.float32) * wq[None, :]).to(dtype).to(tl.float32)
    qn_rot = ((q_rot * q_rstd[:, None]).to(dtype).to(tl.float32) * wq_rot[None, :]).to(dtype).to(tl.float32)
    query = (qn * cos[None, :] + sign[None, :] * qn_rot * sin[None, :]).to(dtype)
    k_at = base + (KV_HEADS * GROUPS + head) * DIM
    kx = tl.load(k_at + d).to(tl.float32)
    kx_rot = tl.load(k_at + rot).to(tl.float32)
    k_rstd = tl.rsqrt(tl.sum(kx * kx, axis=0) / DIM + eps)
    kn = ((kx * k_rstd).to(dtype).to(tl.float32) * wk).to(dtype).to(tl.float32)
    kn_rot = ((kx_rot * k_rstd).to(dtype).to(tl.float32) * wk_rot).to(dtype).to(tl.float32)
    key_new = (kn * cos + sign * kn_rot * sin).to(dtype)
    value_new = tl.load(base + (KV_HEADS * GROUPS + KV_HEADS + head) * DIM + d)
    if split == 0:
        tl.store(kc_ptr + cache_at + pos * stride_cn + d, key_new)
        tl.store(vc_ptr + cache_at + pos * stride_cn + d, value_new.to(dtype))
    mark(trace_ptr, program, 2, TRACE)
    # This split's cached keys before the row's position.
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, DIM], tl.float32)
    for first in range(start, end, BLOCK_N):
        block_keys, block_values, block_inside = keys, values, inside
        n = first + BLOCK_N + tl.arange(0, BLOCK_N)  # the next block, asked for before this one's work
        inside = n < end
        block_at = cache_at + n[:, None] * stride_cn + d[None, :]
        keys = tl.load(kc_ptr + block_at, mask=inside[:, None], other=0.0)
        values = tl.load(vc_ptr + block_at, mask=inside[:, None], other=0.0)
        m_i, l_i, acc = softmax_step(query, block_keys, block_values, block_inside, m_i, l_i, acc, scale)
    if split == 0:  # the new key's term, once
        m_key = tl.sum(query.to(tl.float32) * key_new.to(tl.float32)[None, :], axis=1) * scale
        one = tl.full([BLOCK_G], 1.0, tl.float32)
        value_rows = tl.zeros([BLOCK_G, DIM], tl.float32) + value_new.to(tl.float32)[None, :]
        m_i, l_i, acc = merge_split(m_i, l_i, acc, m_key, one, value_rows)
    out_at = out_ptr + row * stride_out + (head * GROUPS + g)[:, None] * DIM + d[None, :]
    if OUTPUT == OUTPUT_DIRECT:  # the pair's one split is its output: no partial, no counter
        tl.store(out_at, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=g_ok[:, None])
    else:
        at = pair * splits + split
        tl.store(m_ptr + at * BLOCK_G + g, m_i)
        tl.store(l_ptr + at * BLOCK_G + g, l_i)
        tl.store(acc_ptr + (at * BLOCK_G + g[:, None]) * DIM + d[None, :], acc)
    mark(trace_ptr, program, 3, TRACE)
    if OUTPUT == OUTPUT_MERGED:
        done = tl.atomic_add(count_ptr + pair, 1, sem="acq_rel")
    mark(trace_ptr, program, 4, TRACE)
    if OUTPUT == OUTPUT_MERGED:  # noqa: SIM102 (done exists only here, a compile-time branch)
        if done == splits - 1:  # the last split of this pair combines them all
            out = _merged_splits(m_ptr, l_ptr, acc_ptr, pair, splits, g, d, BLOCK_G, DIM, MERGE_CHUNK)
            tl.store(out_at, out.to(out_ptr.dtype.element_ty), mask=g_ok[:, None])
            tl.atomic_xchg(count_ptr + pair, 0)
    mark(trace_ptr, program, 5, TRACE)
