"""A decode step's per-row inputs and its final norm, one kernel each (issue 17: decode at batch 1).

Around its layers a slot decoder's step (executor.slot_cache) ran about 25 small PyTorch kernels
a step: the write position's clamp, the rotary position (the cache position plus the row's mrope
delta), the rotary embedding (a float cast, the frequencies, cos and sin, their scaling, the mrope
sections written back and the halves concatenated, the casts), the attention mask (an arange and a
compare) and the final RMSNorm (the float cast, the square, the mean, the rsqrt, the products, the
casts). In a CUDA graph each costs its launch and ramp, about 1.4 µs at one row: some 36 µs of a
2.3 ms step on an H200. Here they are two Triton kernels:

- ``step_inputs_kernel``: per row, the clamped write position, cos and sin of the row's position
  (every mrope section of a decode token has the same position, so a section's frequencies are
  the text frequencies: cos and sin of ``position * inv_freq``, both halves, scaled, rounded to the
  model's dtype, as transformers computes them) and the mask row;
- ``rms_norm_kernel``: the final norm, rounded where transformers' RMSNorm rounds.

:func:`step_inputs` and :func:`final_norm` build them for a decoder's rotary and norm modules
where they apply: a CUDA tensor with Triton, a rotary module with ``inv_freq`` and
``attention_scaling`` whose output for a decode token the kernel reproduces bit for bit, and a
norm whose output it reproduces within a bfloat16 step (both checked once, on the device, when
built); anything else keeps the modules (None).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from omni_runtime.executor.triton_support import interpreted, triton_available

log = logging.getLogger(__name__)

MASK_BLOCK = 1024  # mask positions a program writes a round
# Positions the rotary check compares (a decode token's: the cache position plus its row's delta).
CHECK_POSITIONS = (0, 1, 7, 255, 1000, 4095, 32767, 100_003)


class StepInputs:
    """``(write, (cos, sin), mask)`` of a decode step's rows in one kernel: ``write`` the cache
    positions (``lengths`` clamped to ``max_len - 1``) [b], cos and sin of each row's rotary
    position [b, 1, head_dim] in ``dtype``, and the attention mask [b, 1, 1, view] (true up to
    the write position)."""

    def __init__(self, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype, max_len: int) -> None:
        self.inv_freq = inv_freq.float().contiguous()
        self.scaling, self.dtype, self.max_len = float(scaling), dtype, max_len

    def __call__(
        self, lengths: torch.Tensor, delta: torch.Tensor, view: int
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        from omni_runtime.executor import decode_input_kernels as k

        rows, half = lengths.shape[0], self.inv_freq.shape[0]
        device = lengths.device
        write = torch.empty(rows, dtype=lengths.dtype, device=device)
        cos = torch.empty(rows, 1, 2 * half, dtype=self.dtype, device=device)
        sin = torch.empty_like(cos)
        mask = torch.empty(rows, 1, 1, view, dtype=torch.bool, device=device)
        k.step_inputs_kernel[(rows,)](
            lengths, delta, self.inv_freq, write, cos, sin, mask,
            self.max_len - 1, view, self.scaling, HALF=half, MASK_BLOCK=MASK_BLOCK,
            LIBDEVICE=not interpreted(),
        )  # fmt: skip
        return write, (cos, sin), mask


class FinalNorm:
    """transformers' RMSNorm of each row of ``x`` [b, H] in one kernel: ``weight * bf16(x *
    rsqrt(mean(x^2) + eps))``, rounded as transformers rounds."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        self.weight, self.eps = weight, float(eps)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from omni_runtime.executor import decode_input_kernels as k

        rows, size = x.shape
        out = torch.empty(rows, size, dtype=self.weight.dtype, device=x.device)
        k.rms_norm_kernel[(rows,)](
            x, self.weight, out, x.stride(0), out.stride(0), self.eps,
            H=size, BLOCK=1 << (size - 1).bit_length(),
        )  # fmt: skip
        return out


def step_inputs(rotary: Any, *, dtype: torch.dtype, device: torch.device, max_len: int) -> StepInputs | None:
    """The one-kernel step inputs for ``rotary`` (a transformers rotary embedding module), or None
    where they do not apply: not a CUDA ``device`` with Triton, no ``inv_freq`` /
    ``attention_scaling``, a rope whose frequencies change with the length, or cos and sin that
    differ from the module's own for a decode token (checked now, at ``CHECK_POSITIONS``)."""
    inv_freq = getattr(rotary, "inv_freq", None)
    scaling = getattr(rotary, "attention_scaling", None)
    if not isinstance(inv_freq, torch.Tensor) or scaling is None or not _kernels_on(device):
        return None
    if getattr(rotary, "rope_type", "default") != "default":  # e.g. dynamic: its frequencies move
        return None
    inv_freq = inv_freq.to(device)
    unclamped = StepInputs(inv_freq, float(scaling), dtype, 1 << 40)
    positions = torch.tensor(CHECK_POSITIONS, dtype=torch.int64, device=device)
    probe = torch.zeros(len(CHECK_POSITIONS), 1, 1, dtype=dtype, device=device)
    with torch.no_grad():
        expected = rotary(probe, positions.view(1, -1, 1).expand(3, -1, 1))
        _, got, _ = unclamped(positions, torch.zeros_like(positions), 1)
    same = all(
        isinstance(e, torch.Tensor) and e.shape == g.shape and torch.equal(e, g)
        for e, g in zip(expected, got, strict=True)
    )
    if not same:
        log.info(
            "the rotary embedding %s keeps its module (the one-kernel step inputs differ)",
            type(rotary).__name__,
        )
        return None
    return StepInputs(inv_freq, float(scaling), dtype, max_len)


def final_norm(norm: Any, *, dtype: torch.dtype, device: torch.device) -> FinalNorm | None:
    """The one-kernel final norm for ``norm`` (a transformers RMSNorm module), or None where it
    does not apply: not a CUDA ``device`` with Triton, no ``weight`` / ``variance_epsilon``, or an output more
    than a bfloat16 step from the module's on random rows (checked now)."""
    weight = getattr(norm, "weight", None)
    eps = getattr(norm, "variance_epsilon", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or eps is None or not _kernels_on(device):
        return None
    fast = FinalNorm(weight, float(eps))
    generator = torch.Generator(device=device).manual_seed(0)
    x = (4 * torch.randn(3, weight.shape[0], generator=generator, device=device)).to(dtype)
    with torch.no_grad():
        expected, got = norm(x), fast(x)
    step = expected.float().abs().max().item() * 2.0**-7  # one bfloat16 step at the largest value
    if expected.shape != got.shape or (expected.float() - got.float()).abs().max().item() > step:
        log.info("the norm %s keeps its module (the one-kernel norm differs)", type(norm).__name__)
        return None
    return fast


def _kernels_on(device: torch.device) -> bool:
    """Whether the kernels run for ``device``: a CUDA GPU with Triton installed (the interpreter
    runs them on CPU too, but a CPU step keeps the modules)."""
    return device.type == "cuda" and triton_available()
