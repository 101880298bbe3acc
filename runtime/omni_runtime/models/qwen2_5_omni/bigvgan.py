"""BigVGAN's anti-aliased SnakeBeta activation as two stencils, instead of about eight kernels.

Each of the BigVGAN's 109 activations (``Qwen2_5OmniAntiAliasedActivation1d``: 6 in each of its
18 AMP blocks, and one before ``conv_post``) upsamples 2x (replicate pad, a depthwise
transposed convolution with a 12-tap Kaiser-sinc filter, a crop), applies SnakeBeta at the high
rate, and downsamples 2x (replicate pad, a depthwise strided convolution with the same kind of
filter). Stock, that is a replicate-pad kernel, cuDNN's grouped transposed-convolution kernel
(its slowest path: float32, one group per channel), four element-wise kernels, another pad and a
depthwise convolution, each reading and writing the whole upsampled signal. On an H100 these made
up about 100 ms of the 141 ms BigVGAN spends on a batch of 16 steady windows (``profile_vocoder.py
--scale``), more than the DiT's matmuls.

The same arithmetic written as index stencils: the transposed convolution with stride 2 is two
6-tap filters (its polyphase components), one per output phase, over the input with its edges
replicated; the strided convolution is a 12-tap filter over every other upsampled sample. Only
gathers, multiplies and adds, so ``torch.compile`` makes the activation two kernels: the upsample
and SnakeBeta (reading the input once, writing the upsampled signal), then the downsample. The
filters are the modules' own buffers and the result equals the stock modules' to float rounding
(table test against transformers' classes).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn


def _phases(
    filter_taps: list[float], *, ratio: int, pad: int, pad_left: int
) -> list[list[tuple[float, int]]]:
    """The transposed convolution ``ratio * conv_transpose1d(pad_replicate(x, pad), f, stride=ratio)``
    cropped by ``pad_left``, per output phase q (output ``ratio * m + q``): (weight, offset) pairs,
    output = sum(weight * x[clamp(m + offset)]). Offsets are relative to the unpadded input."""
    size = len(filter_taps)
    phases = []
    for q in range(ratio):
        first = (q + pad_left) % ratio  # the first tap that lands on this phase
        centre = (q + pad_left - first) // ratio
        taps = [
            (ratio * filter_taps[first + ratio * j], centre - j - pad)
            for j in range((size - first + ratio - 1) // ratio)
        ]
        # Every tap must read the replicate-padded input, never the transposed convolution's own
        # zero border: true for BigVGAN's sizes (ratio 2, 12 taps); checked rather than assumed.
        if min(centre - j for j in range(len(taps))) < 0 or centre > 2 * pad:
            raise ValueError(f"upsampling ratio {ratio} with {size} taps has no exact polyphase form here")
        phases.append(taps)
    return phases


def upsample_snake(
    x: torch.Tensor, alpha: torch.Tensor, inv_beta: torch.Tensor, phases: list[list[tuple[float, int]]]
) -> torch.Tensor:
    """Upsample [B, C, T] by ``len(phases)`` and apply SnakeBeta (``y + inv_beta * sin(alpha * y)^2``;
    ``alpha`` and ``inv_beta`` are [C, 1]): [B, C, ratio * T]. Output ``t`` is phase ``t % ratio``
    of input position ``t // ratio``, each tap a gather of the edge-replicated input."""
    ratio, n = len(phases), x.shape[-1]
    t = torch.arange(ratio * n, device=x.device)
    m, q = t // ratio, t % ratio
    high: torch.Tensor | None = None
    for j in range(max(len(taps) for taps in phases)):
        offset, weight = m * 0, torch.zeros(ratio * n, device=x.device, dtype=x.dtype)
        for phase, taps in enumerate(phases):
            if j < len(taps):
                offset = torch.where(q == phase, m + taps[j][1], offset)
                weight = torch.where(q == phase, taps[j][0], weight)
        term = x[..., offset.clamp(0, n - 1)] * weight
        high = term if high is None else high + term
    assert high is not None
    return high + inv_beta * torch.sin(high * alpha).pow(2)


def downsample(high: torch.Tensor, down: list[float], down_left: int, ratio: int) -> torch.Tensor:
    """The strided low-pass: [B, C, ratio * T] -> [B, C, T], the edges replicated."""
    size = high.shape[-1]
    m = torch.arange(size // ratio, device=high.device)
    out: torch.Tensor | None = None
    for k, weight in enumerate(down):
        term = high[..., (ratio * m + k - down_left).clamp(0, size - 1)] * weight
        out = term if out is None else out + term
    assert out is not None
    return out


_compiled: dict[str, Any] = {}


def _kernels() -> tuple[Any, Any]:
    """``upsample_snake`` and ``downsample``, each compiled once for every shape on CUDA
    (``OMNI_TORCH_COMPILE=0``: eager). Two kernels, not one: fused into the downsample, each
    SnakeBeta value (a sine) would be recomputed for every one of the 12 taps that read it."""
    if not _compiled:
        eager = os.environ.get("OMNI_TORCH_COMPILE", "1") == "0"
        for fn in (upsample_snake, downsample):
            _compiled[fn.__name__] = fn if eager else torch.compile(fn, dynamic=True)
    return _compiled["upsample_snake"], _compiled["downsample"]


class FusedAntiAliasedSnake(nn.Module):
    """Drop-in for ``Qwen2_5OmniAntiAliasedActivation1d`` with a SnakeBeta activation."""

    def __init__(self, stock: Any, *, compiled: bool) -> None:
        super().__init__()
        up, down, act = stock.upsample, stock.downsample, stock.act
        self.phases = _phases(
            [float(v) for v in up.filter.flatten()], ratio=up.ratio, pad=up.pad, pad_left=up.pad_left
        )
        if down.stride != up.ratio or len(down.filter.flatten()) != down.kernel_size:
            raise ValueError("the downsampling ratio differs from the upsampling one")
        self.down = [float(v) for v in down.filter.flatten()]
        self.down_left = int(down.pad_left)
        with torch.no_grad():  # SnakeBeta's per-channel constants, as its forward computes them
            self.alpha = nn.Buffer(torch.exp(act.alpha.detach()).unsqueeze(-1), persistent=False)
            self.inv_beta = nn.Buffer(
                (1.0 / (torch.exp(act.beta.detach()) + act.no_div_by_zero)).unsqueeze(-1), persistent=False
            )
        self.compiled = compiled
        self.stock = (stock,)  # the module it replaced, unregistered (comparison runs swap it back)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        up, down = _kernels() if self.compiled else (upsample_snake, downsample)
        alpha, inv_beta = self.alpha.to(hidden_states.dtype), self.inv_beta.to(hidden_states.dtype)
        high = up(hidden_states, alpha, inv_beta, self.phases)
        return down(high, self.down, self.down_left, len(self.phases))


def fuse_activations(bigvgan: nn.Module, *, compiled: bool) -> int:
    """Replace every anti-aliased SnakeBeta activation in ``bigvgan`` by the stencils; returns how
    many were replaced (an activation of another kind, or other filter sizes, is left stock)."""
    targets = [
        (parent, name, child)
        for parent in bigvgan.modules()
        for name, child in parent.named_children()
        if type(child).__name__.endswith("AntiAliasedActivation1d")
        and type(child.act).__name__.endswith("SnakeBeta")
    ]
    replaced = 0
    for parent, name, child in targets:
        try:
            fused = FusedAntiAliasedSnake(child, compiled=compiled)
        except ValueError:
            continue
        setattr(parent, name, fused)
        replaced += 1
    return replaced
