"""Triton kernels of executor.decode_inputs: a decode step's per-row inputs and its final norm."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit(do_not_specialize=["max_pos", "view"])
def step_inputs_kernel(
    lengths_ptr, delta_ptr, inv_freq_ptr, write_ptr, cos_ptr, sin_ptr, mask_ptr,
    max_pos, view, scaling,
    HALF: tl.constexpr, MASK_BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr = True,
):  # fmt: skip
    """Row ``program_id``: its write position ``min(length, max_pos)``; cos and sin of
    ``(write + delta) * inv_freq`` in float32 (libdevice's, as torch's CUDA cos and sin), times
    ``scaling``, rounded to the output's dtype, in both halves of a head (transformers' rotary of a
    decode token); and its mask row of ``view`` positions, true up to the write position.
    ``LIBDEVICE`` off: Triton's cos and sin (for the interpreter)."""
    row = tl.program_id(0)
    write = tl.minimum(tl.load(lengths_ptr + row), max_pos)
    tl.store(write_ptr + row, write)
    position = (write + tl.load(delta_ptr + row)).to(tl.float32)
    j = tl.arange(0, HALF)
    freqs = position * tl.load(inv_freq_ptr + j)
    if LIBDEVICE:
        cos = (libdevice.cos(freqs) * scaling).to(cos_ptr.dtype.element_ty)
        sin = (libdevice.sin(freqs) * scaling).to(sin_ptr.dtype.element_ty)
    else:  # Triton's interpreter has no libdevice
        cos = (tl.cos(freqs) * scaling).to(cos_ptr.dtype.element_ty)
        sin = (tl.sin(freqs) * scaling).to(sin_ptr.dtype.element_ty)
    at = row * 2 * HALF + j
    tl.store(cos_ptr + at, cos)
    tl.store(cos_ptr + at + HALF, cos)
    tl.store(sin_ptr + at, sin)
    tl.store(sin_ptr + at + HALF, sin)
    for first in range(0, view, MASK_BLOCK):
        n = first + tl.arange(0, MASK_BLOCK)
        tl.store(mask_ptr + row * view + n, n <= write, mask=n < view)


@triton.jit
def rms_normed(x, gain, rstd, DTYPE: tl.constexpr):
    """transformers' RMSNorm of one row given its ``rstd``: ``weight * bf16(x * rstd)`` rounded
    (float32 values of ``DTYPE``; also the fused MoE layer's norms, moe_layer_kernels)."""
    return ((x * rstd).to(DTYPE).to(tl.float32) * gain).to(DTYPE).to(tl.float32)


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_out, eps, H: tl.constexpr, BLOCK: tl.constexpr):
    """Row ``program_id`` of ``x`` normed as transformers' RMSNorm: float32, ``x * rsqrt(mean(x^2)
    + eps)`` rounded to the weight's dtype, times the weight, rounded."""
    row = tl.program_id(0)
    h = tl.arange(0, BLOCK)
    ok = h < H
    x = tl.load(x_ptr + row * stride_x + h, mask=ok, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / H + eps)
    dtype = out_ptr.dtype.element_ty
    w = tl.load(w_ptr + h, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + h, rms_normed(x, w, rstd, dtype).to(dtype), mask=ok)
