"""BigVGAN's anti-aliased SnakeBeta activation as one Triton kernel, instead of about eight.

Each of the BigVGAN's 109 activations (``Qwen2_5OmniAntiAliasedActivation1d``: 6 in each of its
18 AMP blocks, and one before ``conv_post``) upsamples 2x (replicate pad, a depthwise
transposed convolution with a 12-tap Kaiser-sinc filter, a crop), applies SnakeBeta at the high
rate, and downsamples 2x (replicate pad, a depthwise strided convolution with the same kind of
filter). Stock, that is a replicate-pad kernel, cuDNN's grouped transposed-convolution kernel
(its slowest path: float32, one group per channel), four element-wise kernels, another pad and a
depthwise convolution, each reading and writing the whole upsampled signal. On an H100 these made
up about 100 ms of the 141 ms BigVGAN spends on a batch of 16 steady windows (``profile_vocoder.py
--scale``), more than the DiT's matmuls.

The same arithmetic as one stencil per output sample: the transposed convolution with stride 2
is two 6-tap filters (its polyphase components), one per output phase, over the input with its
edges replicated; the strided convolution is a 12-tap filter over every other upsampled sample,
its edges replicated too. The kernel computes each output from 11 neighbouring input samples
(clamped near the edges) and 12 SnakeBeta values, and writes it once: the upsampled signal never
goes to memory.
The filters are the modules' own buffers, and the result equals the stock modules' to float
rounding (tested against transformers' classes, on the CPU through Triton's interpreter).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

TAPS = 12  # BigVGAN's up- and down-sampling filters (ratio 2): 6 taps per upsampling phase
BLOCK = 256  # output samples per Triton program


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
        count = (size - first + ratio - 1) // ratio
        # Every tap must read the replicate-padded input, never the transposed convolution's own
        # zero border: true for BigVGAN's sizes (ratio 2, 12 taps); checked rather than assumed.
        if centre - (count - 1) < 0 or centre > 2 * pad:
            raise ValueError(f"upsampling ratio {ratio} with {size} taps has no exact polyphase form here")
        phases.append([(ratio * filter_taps[first + ratio * j], centre - j - pad) for j in range(count)])
    return phases


@functools.cache
def _kernel() -> Any:
    import triton  # type: ignore[import-untyped]  # shipped with CUDA torch; imported on first use
    import triton.language as tl  # type: ignore[import-untyped]

    @triton.jit  # type: ignore[untyped-decorator]
    def anti_aliased_snake(
        x_ptr,
        out_ptr,
        alpha_ptr,  # exp(alpha) per channel
        inv_beta_ptr,  # 1 / (exp(beta) + eps) per channel
        w_ptr,  # even phase's 6 weights, odd phase's 6, the downsampling filter's 12
        channels,
        length,
        EVEN0: tl.constexpr,  # even outputs read x[m + EVEN0 - j], odd ones x[m + ODD0 - j]
        ODD0: tl.constexpr,
        DOWN_LEFT: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        first = tl.program_id(1) * BLOCK
        m = first + tl.arange(0, BLOCK)
        valid = m < length
        alpha = tl.load(alpha_ptr + row % channels)
        inv_beta = tl.load(inv_beta_ptr + row % channels)
        x_row = x_ptr + row.to(tl.int64) * length
        out = tl.zeros([BLOCK], dtype=tl.float32)
        if first >= 6 and first + BLOCK + 6 <= length:
            # Away from the edges nothing is clamped and tap k's phase is fixed: every read is
            # x[m + constant] (11 distinct), so the 72 loads per output collapse to 11.
            for k in tl.static_range(12):
                if (k - DOWN_LEFT) % 2 == 0:  # upsampled sample 2m + k - DOWN_LEFT is even
                    base = (k - DOWN_LEFT) // 2 + EVEN0
                    taps = 0
                else:
                    base = (k - DOWN_LEFT - 1) // 2 + ODD0
                    taps = 6
                up = tl.zeros([BLOCK], dtype=tl.float32)
                for j in tl.static_range(6):
                    up += tl.load(w_ptr + taps + j) * tl.load(x_row + m + (base - j))
                wave = tl.sin(up * alpha)
                out += tl.load(w_ptr + 12 + k) * (up + inv_beta * wave * wave)
        else:  # a block at an edge: every index clamped (replicate padding), phase per sample
            for k in tl.static_range(12):
                h = tl.minimum(tl.maximum(2 * m + (k - DOWN_LEFT), 0), 2 * length - 1)
                odd = (h % 2) == 1
                up = tl.zeros([BLOCK], dtype=tl.float32)
                for j in tl.static_range(6):
                    weight = tl.where(odd, tl.load(w_ptr + 6 + j), tl.load(w_ptr + j))
                    index = h // 2 + tl.where(odd, ODD0 - j, EVEN0 - j)
                    index = tl.minimum(tl.maximum(index, 0), length - 1)
                    up += weight * tl.load(x_row + index, mask=valid, other=0.0)
                wave = tl.sin(up * alpha)
                out += tl.load(w_ptr + 12 + k) * (up + inv_beta * wave * wave)
        tl.store(out_ptr + row.to(tl.int64) * length + m, out, mask=valid)

    return anti_aliased_snake


class FusedAntiAliasedSnake(nn.Module):
    """Drop-in for ``Qwen2_5OmniAntiAliasedActivation1d`` with a SnakeBeta activation and
    BigVGAN's filters (ratio 2, 12 taps); other shapes raise ValueError (kept stock)."""

    def __init__(self, stock: Any) -> None:
        super().__init__()
        up, down, act = stock.upsample, stock.downsample, stock.act
        even, odd = _phases(
            [float(v) for v in up.filter.flatten()], ratio=up.ratio, pad=up.pad, pad_left=up.pad_left
        )
        down_taps = [float(v) for v in down.filter.flatten()]
        shape_ok = (
            up.ratio == down.stride == 2
            and len(even) == len(odd) == TAPS // 2
            and len(down_taps) == TAPS
            and [o for _, o in even] == [even[0][1] - j for j in range(6)]
            and [o for _, o in odd] == [odd[0][1] - j for j in range(6)]
        )
        if not shape_ok:
            raise ValueError("not BigVGAN's ratio-2, 12-tap anti-aliasing filters")
        self.even0, self.odd0, self.down_left = even[0][1], odd[0][1], int(down.pad_left)
        device = act.alpha.device
        weights = [w for w, _ in even] + [w for w, _ in odd] + down_taps
        self.weights = nn.Buffer(torch.tensor(weights, dtype=torch.float32, device=device), persistent=False)
        with torch.no_grad():  # SnakeBeta's per-channel constants, as its forward computes them
            self.alpha = nn.Buffer(torch.exp(act.alpha.detach()).float(), persistent=False)
            self.inv_beta = nn.Buffer(
                (1.0 / (torch.exp(act.beta.detach()) + act.no_div_by_zero)).float(), persistent=False
            )
        self.stock = (stock,)  # the module it replaced, unregistered (comparison runs swap it back)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states.float().contiguous()
        batch, channels, length = x.shape
        out = torch.empty_like(x)
        grid = (batch * channels, -(-length // BLOCK))
        _kernel()[grid](
            x,
            out,
            self.alpha,
            self.inv_beta,
            self.weights,
            channels,
            length,
            EVEN0=self.even0,
            ODD0=self.odd0,
            DOWN_LEFT=self.down_left,
            BLOCK=BLOCK,
        )
        return out.to(hidden_states.dtype)


def fuse_activations(bigvgan: nn.Module) -> int:
    """Replace every anti-aliased SnakeBeta activation in ``bigvgan`` by the kernel; returns how
    many were replaced (an activation of another kind, or other filter sizes, is left stock).
    Without Triton (a torch build that lacks it) every activation stays stock."""
    try:
        import triton  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        log.warning("triton is not installed: BigVGAN keeps transformers' activations (slower)")
        return 0
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
            fused = FusedAntiAliasedSnake(child)
        except ValueError:
            continue
        setattr(parent, name, fused)
        replaced += 1
    return replaced
