"""Whisper log-mel features of a short audio without transforming 30 s of padding.

Qwen2.5-Omni's processor pads every audio to Whisper's 30 s window and runs the STFT, the mel
projection and the log over all 3000 frames: about 15 ms of CPU even for a one-second turn. A
frame whose window holds only padding zeros has a mel energy of 0, so its log is the clamp floor,
-10; only the frames that reach into the audio carry anything. So the STFT (most of the cost)
runs over the audio and two FFT windows of zeros after it (the frames past the audio see the same
zeros as in the 30 s window), every later frame's power is 0, and the mel projection, the log,
the floor (the maximum minus 8) and the scaling are the extractor's own operations over all 3000
frames. The attention mask is the extractor's rule (one per hop that starts inside the audio).

`short_features` returns None when an input is outside what this covers (dither, normalisation,
another rate, audio too long for the window); the caller then runs the extractor itself. The
caller also checks the result once against the extractor (`AudioFeatureCache`), so a numerical
difference on some machine turns this path off instead of changing a model's input.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def short_features(
    extractor: Any, wave: np.ndarray, kwargs: dict[str, Any]
) -> dict[str, torch.Tensor] | None:
    """``extractor([wave], **kwargs)``'s ``input_features`` and ``attention_mask`` (padding to
    max_length, PyTorch tensors), computed over the audio only; None where not applicable."""
    needed = ("n_fft", "hop_length", "n_samples", "mel_filters", "sampling_rate")
    if not all(hasattr(extractor, name) for name in needed):
        return None
    n_fft, hop, total = int(extractor.n_fft), int(extractor.hop_length), int(extractor.n_samples)
    if (
        getattr(extractor, "dither", 0.0) != 0.0
        or kwargs.get("do_normalize")
        or kwargs.get("max_length") not in (None, total)
        or kwargs.get("sampling_rate") not in (None, extractor.sampling_rate)
        or kwargs.get("pad_to_multiple_of") is not None
        or total % hop != 0
        or wave.ndim != 1
        or wave.size + 2 * n_fft > total
    ):
        return None
    frames = total // hop
    span = -(-(wave.size + 2 * n_fft) // hop) * hop
    padded = np.zeros(span, dtype=np.float32)
    padded[: wave.size] = wave
    window = torch.hann_window(n_fft)
    stft = torch.stft(torch.from_numpy(padded)[None], n_fft, hop, window=window, return_complex=True)
    power = stft[..., :-1].abs() ** 2
    # The mel projection runs over all the window's frames (zero columns past the audio): a matrix
    # product of another width may sum in another order (one ulp apart for a 10 ms audio).
    magnitudes = torch.zeros((1, power.shape[1], frames), dtype=torch.float32)
    magnitudes[..., : power.shape[2]] = power
    mel = torch.from_numpy(extractor.mel_filters).to(torch.float32)
    log_spec = torch.clamp(mel.T @ magnitudes, min=1e-10).log10()
    top = log_spec.max(dim=2, keepdim=True)[0].max(dim=1, keepdim=True)[0]
    features = (torch.maximum(log_spec, top - 8.0) + 4.0) / 4.0
    out = {"input_features": features}
    if kwargs.get("return_attention_mask"):
        samples = np.zeros((1, total), dtype=np.int32)
        samples[:, : wave.size] = 1
        out["attention_mask"] = torch.from_numpy(np.ascontiguousarray(samples[:, ::hop]))
    return out
