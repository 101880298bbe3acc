"""Band-limited sample-rate conversion in numpy: a polyphase windowed-sinc filter.

The audio encoder wants 16 kHz; clients send 8, 22.05, 44.1, 48 kHz and more. Dropping or
repeating samples aliases everything above the new Nyquist frequency into the speech band, so
we low-pass and resample in one polyphase pass, with the same design as
``scipy.signal.resample_poly`` (Kaiser window, beta 5, 10 zero crossings per side) without
depending on scipy.
"""

from __future__ import annotations

from functools import lru_cache
from math import ceil, gcd

import numpy as np

_ZERO_CROSSINGS = 10
_KAISER_BETA = 5.0
_CHUNK = 1 << 15  # output samples per vectorised block: bounds memory for long inputs


@lru_cache(maxsize=32)
def _lowpass(up: int, down: int) -> tuple[np.ndarray, int]:
    """The anti-aliasing / anti-imaging filter at the upsampled rate, gain ``up``, and its half length."""
    max_rate = max(up, down)
    half_len = _ZERO_CROSSINGS * max_rate
    cutoff = 1.0 / max_rate  # as a fraction of the upsampled Nyquist frequency
    n = np.arange(-half_len, half_len + 1, dtype=np.float64)
    taps = cutoff * np.sinc(cutoff * n) * np.kaiser(2 * half_len + 1, _KAISER_BETA)
    taps *= up / taps.sum()
    return taps, half_len


def resample(pcm: np.ndarray, *, orig_sr: int, target_sr: int) -> np.ndarray:
    """Resample mono float audio from ``orig_sr`` to ``target_sr`` (float32 out).

    Output length is ``ceil(len(pcm) * target_sr / orig_sr)``; the filter is centred, so there is
    no group delay.
    """
    if orig_sr <= 0 or target_sr <= 0:
        raise ValueError(f"sample rates must be positive, got {orig_sr} -> {target_sr}")
    x = np.asarray(pcm, dtype=np.float64).reshape(-1)
    if orig_sr == target_sr or x.size == 0:
        return x.astype(np.float32)
    g = gcd(orig_sr, target_sr)
    up, down = target_sr // g, orig_sr // g
    taps, half_len = _lowpass(up, down)
    n_out = ceil(x.size * up / down)
    # y[n] = sum_j taps[m - j*up] * x[j] with m = n*down + half_len: for each output only the
    # input samples whose upsampled position falls under the filter contribute (one phase).
    per_output = ceil(taps.size / up) + 1
    out = np.empty(n_out, dtype=np.float64)
    for start in range(0, n_out, _CHUNK):
        n = np.arange(start, min(start + _CHUNK, n_out), dtype=np.int64)
        m = n * down + half_len
        j_first = -((-(m - 2 * half_len)) // up)  # ceil division
        j = j_first[:, None] + np.arange(per_output, dtype=np.int64)[None, :]
        k = m[:, None] - j * up
        valid = (k >= 0) & (k < taps.size) & (j >= 0) & (j < x.size)
        weights = np.where(valid, taps[np.clip(k, 0, taps.size - 1)], 0.0)
        samples = x[np.clip(j, 0, x.size - 1)]
        out[start : start + n.size] = (weights * samples).sum(axis=1)
    return out.astype(np.float32)
