"""Qwen2.5-Omni token2wav (DiT flow matching to mel, BigVGAN to 24 kHz audio) over code windows.

``Qwen2_5OmniToken2WavModel.forward`` turns a whole code sequence into audio. Streaming speech
instead synthesises windows: the codes of one segment plus a few codes of context on each side
(the DiT attends a block back and a block ahead), keeping only the segment's own samples. Audio
length is exact: each code is ``repeats`` mel frames and each mel frame ``prod(upsample_rates)``
samples, so a window of k codes yields k * samples_per_code samples.

The DiT's starting noise comes from a generator seeded per request and window, so a seeded
request speaks the same audio every time (the stock ``sample`` draws from the global RNG), and
per-window constants (speaker encoding, codec embeddings, masks) are computed once per window
instead of once per ODE evaluation.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver


class QwenVocoder:
    def __init__(
        self,
        token2wav: Any,
        *,
        speakers: dict[str, dict[str, Any]],
        device: torch.device,
        sample_rate: int = 24000,
        num_steps: int = 10,
        guidance_scale: float = 0.5,
        sway_coefficient: float = -1.0,
    ) -> None:
        self.dit = token2wav.code2wav_dit_model
        self.bigvgan = token2wav.code2wav_bigvgan_model
        self.device = device
        self.sample_rate = sample_rate
        self.repeats = int(self.dit.config.repeats)
        self.samples_per_code = self.repeats * math.prod(self.bigvgan.config.upsample_rates)
        self.num_embeds = int(self.dit.config.num_embeds)
        self.num_steps, self.guidance_scale, self.sway = num_steps, guidance_scale, sway_coefficient
        self.speakers = {
            name: (value["cond"].to(device).float(), value["ref_mel"].to(device).float())
            for name, value in speakers.items()
        }

    @torch.inference_mode()
    def synthesize(
        self, codes: list[int], *, start: int, end: int, ctx_start: int, ctx_end: int, voice: str, seed: int
    ) -> np.ndarray:
        if end <= start:
            return np.zeros(0, dtype=np.float32)
        window = torch.tensor([codes[ctx_start:ctx_end]], dtype=torch.long, device=self.device)
        # A random-weight talker can emit ids the DiT's table lacks; a trained one never does.
        window = torch.where(window < self.num_embeds, window, torch.zeros_like(window))
        cond, ref_mel = self.speakers[voice]
        generator = torch.Generator(device=self.device).manual_seed((seed * 1_000_003 + start) & 0x7FFFFFFF)
        mel = self._dit_sample(cond, ref_mel, window, generator)
        wave = self.bigvgan(mel).reshape(-1).float()
        offset = (start - ctx_start) * self.samples_per_code
        return wave[offset : offset + (end - start) * self.samples_per_code].cpu().numpy().astype(np.float32)

    def _dit_sample(
        self, cond: torch.Tensor, ref_mel: torch.Tensor, code: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        """``Qwen2_5OmniToken2WavDiTModel.sample`` (classifier-free guidance, RK4 ODE), faster.

        The stock forward recomputes, at each of the ODE's ~36 evaluations, things that do not
        change within a window: the ECAPA speaker encoding of the reference mel, the codec
        embeddings, the rotary table and the block mask. They are computed once here; the
        per-step work is the time embedding and the transformer blocks, as in the stock code.
        """
        dit = self.dit
        frames = code.shape[1] * self.repeats
        state = torch.randn(
            [1, frames, dit.mel_dim], generator=generator, device=self.device, dtype=ref_mel.dtype
        )
        speaker = cond.unsqueeze(1).repeat(1, frames, 1)
        # Conditional and unconditional halves, as DiTInputEmbedding builds them with apply_cfg.
        speaker2 = torch.cat([speaker, torch.zeros_like(speaker)])
        ref2 = torch.cat([ref_mel, torch.zeros_like(ref_mel)])
        ref_encoded = dit.input_embed.spk_encoder(ref2).unsqueeze(1).repeat(1, frames, 1)
        code_embed = torch.cat([dit.text_embed(code, drop_code=False), dit.text_embed(code, drop_code=True)])
        constant = torch.cat((ref_encoded, code_embed, speaker2), dim=-1)
        positions = torch.arange(frames, device=self.device)[None, :].repeat(2, 1)
        rotary = dit.rotary_embed(speaker2, positions)
        block_diff = dit._create_block_diff(speaker2)
        masks = [
            (block_diff >= -float(layer.look_backward_block)) & (block_diff <= float(layer.look_ahead_block))
            for layer in dit.transformer_blocks
        ]

        def ode(time_step: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
            t_emb = dit.time_embed(time_step.reshape(1).repeat(2))
            x = dit.input_embed.proj(torch.cat((torch.cat([hidden, hidden]), constant), dim=-1))
            for layer, mask in zip(dit.transformer_blocks, masks, strict=True):
                x = self._block(layer, x, t_emb, rotary, mask)
            out = dit.proj_out(dit.norm_out(x, t_emb))
            guided, null = torch.chunk(out, 2, dim=0)
            return guided + (guided - null) * self.guidance_scale

        times = torch.linspace(0, 1, self.num_steps, device=self.device, dtype=cond.dtype)
        if self.sway is not None:
            times += self.sway * (torch.cos(torch.pi / 2 * times) - 1 + times)
        trajectory = RungeKutta4ODESolver(function=ode, initial_value=state).integrate(times)
        return trajectory[-1].permute(0, 2, 1)

    @staticmethod
    def _block(
        layer: Any, x: torch.Tensor, t_emb: torch.Tensor, rotary: Any, mask: torch.Tensor
    ) -> torch.Tensor:
        """``DiTDecoderLayer.forward`` with its attention mask precomputed."""
        norm, gate_msa, shift_mlp, scale_mlp, gate_mlp = layer.attn_norm(x, emb=t_emb)
        x = x + gate_msa.unsqueeze(1) * layer.attn(
            hidden_states=norm, position_embeddings=rotary, attention_mask=mask
        )
        norm = layer.ff_norm(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        return x + gate_mlp.unsqueeze(1) * layer.ff(norm)
