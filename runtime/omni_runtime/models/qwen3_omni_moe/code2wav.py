"""Qwen3-Omni's Code2Wav over windows of codec frames: streaming 24 kHz audio with left context.

``Qwen3OmniMoeCode2Wav`` turns frames of ``num_quantizers`` codes (12.5 frames a second) into
audio, ``total_upsample`` (1920) samples a frame: the codebooks' embeddings averaged, a
sliding-window causal transformer, then causal convolutions and transposed convolutions. Each
transposed convolution trims ``stride`` samples at its end (and its start), so its last outputs
need the *next* input: a decode of n frames yields ``n * 1920 - lost`` samples (555 at the released
rates), the missing tail being the part that depends on the frame after the last. transformers'
``chunked_decode`` (300-frame chunks, 25 frames of left context) drops that tail at every chunk
boundary.

Streaming instead synthesises a window: the frames ``[start, end)`` it keeps, ``left_context``
frames before them and one frame after (``right_context = 1``: more than the lost tail), and
keeps exactly the samples of ``[start, end)``. Joined windows then equal one decode of the whole
utterance wherever the left context covers the model's receptive field (71 frames per layer of
the transformer's 72-frame sliding window, plus about 10 frames of convolutions); with less, a
window's first samples differ from the whole decode by what its attention no longer sees
(measured in tests/component/engine/test_qwen3_speech.py; the default 25 frames is
``chunked_decode``'s). The stream's last window has no frame after it and
ends ``lost`` samples short, as the whole decode does.

Windows of one size from different requests run as one batch; there is nothing to seed (no
noise) and no speaker conditioning (the talker chose the voice).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omni_runtime.models.common import SingleWindow

MAX_BATCH = 16  # windows of one size synthesised together


class Qwen3Code2Wav(SingleWindow):
    def __init__(self, code2wav: Any, *, device: torch.device, sample_rate: int = 24000) -> None:
        self.model = code2wav
        self.device = device
        self.sample_rate = sample_rate
        self.samples_per_code = int(code2wav.total_upsample)
        self.groups = int(code2wav.config.num_quantizers)
        self.codebook = int(code2wav.config.codebook_size)
        self.dtype = next(code2wav.parameters()).dtype

    @torch.inference_mode()
    def decode(self, frames: list[Any]) -> np.ndarray:
        """One decode over every frame (what ``chunked_decode`` does for utterances under its chunk)."""
        return self._run([frames])[0]

    @torch.inference_mode()
    def synthesize_many(self, items: list[dict[str, Any]]) -> list[np.ndarray]:
        """Several windows; windows of one context size run as one batch, smallest first."""
        results: list[np.ndarray] = [np.zeros(0, dtype=np.float32)] * len(items)
        groups: dict[int, list[int]] = {}
        for i, item in enumerate(items):
            w = item["window"]
            if w["end"] > w["start"]:
                groups.setdefault(w["ctx_end"] - w["ctx_start"], []).append(i)
        for _, members in sorted(groups.items()):
            for first in range(0, len(members), MAX_BATCH):
                chunk = members[first : first + MAX_BATCH]
                windows = [items[i]["window"] for i in chunk]
                frames = [
                    items[i]["codes"][w["ctx_start"] : w["ctx_end"]]
                    for i, w in zip(chunk, windows, strict=True)
                ]
                for i, w, wave in zip(chunk, windows, self._run(frames), strict=True):
                    offset = (w["start"] - w["ctx_start"]) * self.samples_per_code
                    results[i] = wave[offset : (w["end"] - w["ctx_start"]) * self.samples_per_code]
        return results

    def _run(self, frames: list[list[Any]]) -> list[np.ndarray]:
        codes = torch.tensor([[list(f) for f in row] for row in frames], dtype=torch.long, device=self.device)
        if codes.shape[-1] != self.groups:
            raise ValueError(f"frames have {codes.shape[-1]} codes; Code2Wav takes {self.groups}")
        # A random-weight talker may draw ids past the codebook; a trained one never does.
        codes = torch.where(codes < self.codebook, codes, torch.zeros_like(codes)).transpose(1, 2)
        wav = self.model(codes)[:, 0].float()
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        return [row.cpu().numpy().astype(np.float32) for row in wav]

    def warmup(self, sizes: frozenset[int]) -> None:
        """Nothing to capture yet (the windows run eagerly)."""
        return None
