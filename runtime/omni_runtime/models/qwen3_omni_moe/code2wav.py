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

Windows of one size from different requests run as one batch, padded up to a batch bucket; there
is nothing to seed (no noise) and no speaker conditioning (the talker chose the voice). On CUDA a
recurring window size (the segmenter's ``reusable`` windows: the first, the ramp's and the steady
one) runs as a captured CUDA graph per batch bucket (``window_graphs``): eagerly a window is a few
hundred small kernels, 12 ms of launches for the 4 frames of a first window, which under load
wait for the GIL behind the thinker's and talker's threads. The transformer's masks are built
once per shape, outside the graph. One-off sizes (a stream's last window) run eagerly.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from omni_runtime.models.common import SingleWindow
from omni_runtime.models.window_graphs import (
    BATCH_BUCKETS,
    MAX_GRAPHS,
    WindowGraphs,
    configured_buckets,
    window_batches,
)

log = logging.getLogger(__name__)
MAX_BATCH = BATCH_BUCKETS[-1]  # windows of one size synthesised together


class Qwen3Code2Wav(SingleWindow):
    def __init__(
        self, code2wav: Any, *, device: torch.device, sample_rate: int = 24000, cuda_graphs: bool = True
    ) -> None:
        self.model = code2wav
        self.device = device
        self.sample_rate = sample_rate
        self.samples_per_code = int(code2wav.total_upsample)
        self.groups = int(code2wav.config.num_quantizers)
        self.codebook = int(code2wav.config.codebook_size)
        self.dtype = next(code2wav.parameters()).dtype
        self.graphs = WindowGraphs(
            self._forward,
            device=device,
            enabled=cuda_graphs,
            limit=MAX_GRAPHS,
            buckets=configured_buckets(),
        )
        self._masks: dict[tuple[int, int], dict[str, Any]] = {}  # (batch, frames) -> the transformer's

    @torch.inference_mode()
    def decode(self, frames: list[Any]) -> np.ndarray:
        """One decode over every frame (what ``chunked_decode`` does for utterances under its chunk)."""
        return self._run([frames])[0]

    @torch.inference_mode()
    def synthesize_many(self, items: list[dict[str, Any]]) -> list[np.ndarray]:
        """Several windows; windows of one context size run as one batch, smallest first
        (``window_batches``)."""
        results: list[np.ndarray] = [np.zeros(0, dtype=np.float32)] * len(items)
        for reusable, chunk in window_batches(items, MAX_BATCH):
            windows = [items[i]["window"] for i in chunk]
            frames = [
                items[i]["codes"][w["ctx_start"] : w["ctx_end"]] for i, w in zip(chunk, windows, strict=True)
            ]
            for i, w, wave in zip(chunk, windows, self._run(frames, use_graph=reusable), strict=True):
                offset = (w["start"] - w["ctx_start"]) * self.samples_per_code
                results[i] = wave[offset : (w["end"] - w["ctx_start"]) * self.samples_per_code]
        return results

    @torch.inference_mode()
    def warmup(self, sizes: frozenset[int]) -> None:
        """Capture the graph of every recurring window size at every batch bucket now, so no
        client waits for a capture."""
        if not self.graphs.enabled:
            return
        for size in sorted(sizes):
            frames = [[0] * self.groups] * size
            for rows in self.graphs.buckets:
                self._run([frames] * rows, use_graph=True)
        self.graphs.eager_calls = 0
        log.info("Code2Wav: %d window graphs captured", len(self.graphs))

    def _run(self, frames: list[list[Any]], *, use_graph: bool = False) -> list[np.ndarray]:
        """Waves of equal-length frame lists, a row each: padded up to a batch bucket (the last row
        repeated) and through the shape's graph when ``use_graph``, eagerly otherwise."""
        codes = torch.tensor([[list(f) for f in row] for row in frames], dtype=torch.long)
        if codes.shape[-1] != self.groups:
            raise ValueError(f"frames have {codes.shape[-1]} codes; Code2Wav takes {self.groups}")
        n = codes.shape[0]
        if use_graph and self.graphs.enabled:
            codes = torch.cat([codes, codes[-1:].expand(self.graphs.bucket(n) - n, -1, -1)])
        # A random-weight talker may draw ids past the codebook; a trained one never does.
        codes = torch.where(codes < self.codebook, codes, torch.zeros_like(codes)).transpose(1, 2)
        codes = codes.contiguous().to(self.device)
        wav = self.graphs.run({"codes": codes}, use_graph=use_graph)[:n, 0].float()
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        return [row.cpu().numpy().astype(np.float32) for row in wav]

    def _forward(self, codes: torch.Tensor) -> torch.Tensor:
        """``Qwen3OmniMoeCode2Wav.forward`` with the transformer's masks built beforehand, once per
        shape (transformers checks the positions for packed sequences with a host sync, which a
        graph capture refuses)."""
        model = self.model
        hidden = model.code_embedding(codes + model.code_offset).mean(1)
        batch, length = hidden.shape[0], hidden.shape[1]
        positions = torch.arange(length, device=hidden.device).unsqueeze(0)
        masks = self._masks.get((batch, length))
        if masks is None:
            masks = self._masks[(batch, length)] = self._build_masks(hidden, positions)
        hidden = model.pre_transformer(inputs_embeds=hidden, attention_mask=masks, position_ids=positions)
        hidden = hidden.last_hidden_state.permute(0, 2, 1)
        for blocks in model.upsample:
            for block in blocks:
                hidden = block(hidden)
        wav = hidden
        for block in model.decoder:
            wav = block(wav)
        return wav.clamp(min=-1, max=1)

    def _build_masks(self, hidden: torch.Tensor, positions: torch.Tensor) -> dict[str, Any]:
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        transformer = self.model.pre_transformer
        kwargs = {
            "config": transformer.config,
            "inputs_embeds": hidden,
            "attention_mask": None,
            "past_key_values": None,
            "position_ids": positions,
        }
        masks = {"full_attention": create_causal_mask(**kwargs)}
        if transformer.has_sliding_layers:
            masks["sliding_attention"] = create_sliding_window_causal_mask(**kwargs)
        return masks
