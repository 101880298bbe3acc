"""Qwen2.5-Omni token2wav (DiT flow matching to mel, BigVGAN to 24 kHz audio) over code windows.

``Qwen2_5OmniToken2WavModel.forward`` turns a whole code sequence into audio. Streaming speech
instead synthesises windows: the codes of one segment plus a few codes of context on each side
(the DiT attends a block back and a block ahead), keeping only the segment's own samples. Audio
length is exact: each code is ``repeats`` mel frames and each mel frame ``prod(upsample_rates)``
samples, so a window of k codes yields k * samples_per_code samples.

Differences from the stock code, none in the math:
- the starting noise comes from generators seeded per request and position (``NOISE_BLOCK``
  codes each), so a seeded request speaks the same audio every time (the stock ``sample``
  draws from the global RNG), and a window's noise is the slice of the utterance's noise at
  its position: windows that tile an utterance start from the noise one window over all of it
  would, and differ from it only where their context is cut short;
- what does not change within a window (the ECAPA speaker encoding of the reference mel, the
  codec embeddings, the rotary table, the block masks) is computed once instead of at each of
  the ODE's 36 evaluations, and the RK4 loop runs on Python floats, without host syncs;
- on CUDA, a recurring window size (streaming's first and steady windows) is one CUDA graph (the
  whole ODE and BigVGAN): a window is some 20k small kernels, so launching them one by one
  would dominate the time to first audio. One-off sizes (final windows) run eagerly;
- on CUDA the DiT block goes through ``torch.compile`` (one graph for all 22 blocks: the many
  element-wise kernels of the adaptive norms, gates and concatenations fuse), and float32
  matmuls use TF32 tensor cores, as the DiT runs in float32. Measured on an H100 (random
  weights, first window of 15 codes): 236 ms as a plain CUDA graph, 118 ms with TF32.
  ``OMNI_TORCH_COMPILE=0`` turns compilation off;
- on CUDA the DiT runs in bfloat16 (the ODE state stays float32), as the thinker and talker do:
  steady windows batched 8 at a time synthesise 36.5 audio-seconds per second instead of 21.8 in
  float32 (H100, released size, random weights), and the audio of one window differs from
  float32's by an SNR of 46 dB. ``OMNI_VOCODER_DTYPE=float32`` keeps the stock precision;
- a DiT block's adaptive norms take their shift, scale and gate from the time step alone, and
  the ODE's 36 time points are fixed: their values for every evaluation and block are computed
  once, at load (``modulations``), instead of a time embedding, a SiLU and a 1024 x 6144 linear
  per block at each evaluation; q, k and v are one linear (``fuse_qkv``: the three weights
  become views of one, so transformers' forward still reads them), and the feed-forward's first
  linear applies its tanh GELU in the GEMM's epilogue. ``stock_dit`` runs transformers' own
  block instead (the baseline ``tests/gpu/profile_vocoder.py`` measures against);
- on CUDA, BigVGAN's 109 anti-aliased activations (upsample, SnakeBeta, downsample: about eight
  kernels each, cuDNN's slowest grouped path among them) are one Triton kernel each (`bigvgan`):
  the same arithmetic, the upsampled signal never written to memory. BigVGAN stays float32 (in
  bfloat16 its audio is only 28.6 dB from float32's).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import apply_rotary_pos_emb, deinterleave_head_dim

from omni_runtime.contract import switches
from omni_runtime.models.common import SingleWindow
from omni_runtime.models.qwen2_5_omni.bigvgan import fuse_activations
from omni_runtime.models.window_graphs import MAX_GRAPHS, WindowGraphs, configured_buckets, window_batches

log = logging.getLogger(__name__)
MAX_BATCH = 16  # windows of one size from different requests synthesised together
MAX_TAIL_GRAPHS = 96  # one-off sizes: every size below the largest recurring one at batch 1, and more
MIN_AMPLITUDE = math.exp(-115 / 20.0 * math.log(10))  # BigVGAN's -115 dB floor
NOISE_BLOCK = 16  # codes of starting noise per generator: a window of 55 codes draws 4 or 5 blocks


class QwenVocoder(SingleWindow):
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
        cuda_graphs: bool = True,
        dit_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.dit = token2wav.code2wav_dit_model.to(dit_dtype)
        self.dit_dtype = dit_dtype
        self.bigvgan = token2wav.code2wav_bigvgan_model
        self.device = device
        self.sample_rate = sample_rate
        self.repeats = int(self.dit.config.repeats)
        self.samples_per_code = self.repeats * math.prod(self.bigvgan.config.upsample_rates)
        self.num_embeds = int(self.dit.config.num_embeds)
        self.guidance_scale = guidance_scale
        self.times = self._time_points(num_steps, sway_coefficient)
        self.evaluation_times = evaluation_times(self.times)  # the ODE's 36 evaluations, in order
        self._stock_dit = False
        fuse_qkv(self.dit)
        self.modulation, self.final_modulation = modulations(self.dit, self.evaluation_times, device)
        self.speakers = {
            name: (value["cond"].to(device).float(), value["ref_mel"].to(device).float())
            for name, value in speakers.items()
        }
        self._encoded: dict[str, torch.Tensor] = {}  # voice -> ECAPA(ref_mel) for [cond, uncond]
        self.block: Callable[..., torch.Tensor] = _dit_block
        # One-off window sizes (a reply shorter than the second window) run eagerly: through a
        # shape-generic compile, so a new size never recompiles the block (seconds, with the GIL
        # held, while every other stream waits).
        self.block_any_size: Callable[..., torch.Tensor] = _dit_block
        if device.type == "cuda":
            fuse_activations(self.bigvgan)  # a Triton kernel: the CPU keeps transformers' modules
            # Only the float32 DiT and BigVGAN are affected: every other stage runs in bfloat16.
            torch.backends.cuda.matmul.allow_tf32 = True
            if switches.flag("OMNI_TORCH_COMPILE"):
                # One specialisation per (window size, batch bucket): 3 x 5 by default, more than
                # dynamo's default limit of 8, past which the block would silently run uncompiled.
                torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
                self.block = torch.compile(_dit_block, dynamic=False)
                self.block_any_size = torch.compile(_dit_block, dynamic=True)
        # One graph per (window size, batch bucket): the whole ODE and BigVGAN.
        buckets = configured_buckets()
        self.graphs = WindowGraphs(
            self._synthesize, device=device, enabled=cuda_graphs, limit=MAX_GRAPHS, buckets=buckets
        )
        # One-off sizes are graphs too, captured through the shape-generic block: launched one by
        # one, a window's 36 ODE steps x 22 blocks took 0.4-0.8 s of the vocoder thread on an H100
        # (every stream waited); a replay takes milliseconds. Batch-1 sizes are captured at start.
        self.tail_graphs = WindowGraphs(
            lambda **kw: self._synthesize(**kw, block=self.block_any_size),
            device=device,
            enabled=cuda_graphs,
            limit=MAX_TAIL_GRAPHS,
            warm_once=True,
            buckets=buckets,
        )

    @property
    def stock_dit(self) -> bool:
        """Whether each evaluation runs transformers' own DiT block instead of the fused one (the
        baseline of ``tests/gpu/profile_vocoder.py``); a change drops every captured graph."""
        return self._stock_dit

    @stock_dit.setter
    def stock_dit(self, stock: bool) -> None:
        if stock != self._stock_dit:
            self._stock_dit = stock
            self.graphs.clear()
            self.tail_graphs.clear()

    @staticmethod
    def _time_points(num_steps: int, sway: float | None) -> list[float]:
        times = torch.linspace(0, 1, num_steps, dtype=torch.float32)
        if sway is not None:
            times += sway * (torch.cos(torch.pi / 2 * times) - 1 + times)
        return [float(t) for t in times]

    @torch.inference_mode()
    def synthesize_many(self, items: list[dict[str, Any]]) -> list[np.ndarray]:
        """Several requests' windows; windows of one size run as one batch (padded to a bucket),
        smallest first (``window_batches``)."""
        results: list[np.ndarray] = [np.zeros(0, dtype=np.float32)] * len(items)
        for reusable, chunk in window_batches(items, MAX_BATCH):
            for i, wave in zip(chunk, self._batch([items[i] for i in chunk], reusable), strict=True):
                results[i] = wave
        return results

    @torch.inference_mode()
    def warmup(self, sizes: frozenset[int]) -> None:
        """Capture the graph of every recurring window size at every batch bucket now, so no
        client waits for a capture (each costs a compile-warm run plus the capture)."""
        if not self.graphs.enabled:
            return
        voice = next(iter(self.speakers))
        for size in sorted(sizes):
            codes = [0] * size
            window = {"start": 0, "end": size, "ctx_start": 0, "ctx_end": size}
            for rows in self.graphs.buckets:
                item = {"codes": codes, "window": window, "voice": voice, "seed": 0, "reusable": True}
                self.synthesize_many([item] * rows)
        # One-off sizes: a short reply's windows (smaller than the largest recurring size; a
        # longer stream's last window is widened to a recurring one). Compile the shape-generic
        # block now, then capture each such size at batch 1 (a few at once come later, on use).
        began = time.perf_counter()
        for size in (n for n in range(1, max(sizes)) if n not in sizes):
            window = {"start": 0, "end": size, "ctx_start": 0, "ctx_end": size}
            item = {"codes": [0] * size, "window": window, "voice": voice, "seed": 0, "reusable": False}
            self.synthesize_many([item])
        self.graphs.eager_calls = self.tail_graphs.eager_calls = 0
        log.info(
            "vocoder: %d window graphs captured, and %d for one-off sizes in %.1f s",
            len(self.graphs),
            len(self.tail_graphs),
            time.perf_counter() - began,
        )

    def _batch(self, items: list[dict[str, Any]], reusable: bool) -> list[np.ndarray]:
        rows = (self.graphs if reusable else self.tail_graphs).bucket(len(items))
        waves = self._run(self.inputs(items + [items[-1]] * (rows - len(items))), use_graph=reusable)
        out = []
        for row, item in enumerate(items):
            w = item["window"]
            offset = (w["start"] - w["ctx_start"]) * self.samples_per_code
            piece = waves[row, offset : offset + (w["end"] - w["start"]) * self.samples_per_code]
            out.append(piece.cpu().numpy().astype(np.float32))
        return out

    def inputs(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """The tensors ``_synthesize`` takes for windows of one context size, a row each."""
        codes, noises, conds, encoded_cond, encoded_uncond = [], [], [], [], []
        for item in items:
            w = item["window"]
            codes.append(item["codes"][w["ctx_start"] : w["ctx_end"]])
            noises.append(self._noise(item["seed"], w["ctx_start"], w["ctx_end"]))
            conds.append(self.speakers[item["voice"]][0])
            encoded = self._speaker_encoding(item["voice"])
            encoded_cond.append(encoded[:1])
            encoded_uncond.append(encoded[1:])
        code = torch.tensor(codes, dtype=torch.long, device=self.device)
        # A random-weight talker can emit ids the DiT's table lacks; a trained one never does.
        code = torch.where(code < self.num_embeds, code, torch.zeros_like(code))
        return {
            "code": code,
            "noise": torch.cat(noises),
            "cond": torch.cat(conds),
            "encoded": torch.cat(encoded_cond + encoded_uncond),  # conditional rows, then unconditional
        }

    def _noise(self, seed: int, ctx_start: int, ctx_end: int) -> torch.Tensor:
        """The starting noise of codes ``[ctx_start, ctx_end)``: the slice at that position of the
        utterance's noise, drawn in blocks of ``NOISE_BLOCK`` codes seeded by (seed, block)."""
        first, last = ctx_start // NOISE_BLOCK, (ctx_end - 1) // NOISE_BLOCK
        blocks = []
        for block in range(first, last + 1):
            generator = torch.Generator(device=self.device).manual_seed(
                (seed * 1_000_003 + block) & 0x7FFFFFFF
            )
            shape = [1, NOISE_BLOCK * self.repeats, self.dit.mel_dim]
            blocks.append(torch.randn(shape, generator=generator, device=self.device))
        offset = (ctx_start - first * NOISE_BLOCK) * self.repeats
        return torch.cat(blocks, dim=1)[:, offset : offset + (ctx_end - ctx_start) * self.repeats]

    def _run(self, inputs: dict[str, torch.Tensor], *, use_graph: bool) -> torch.Tensor:
        """A recurring size through its graph; a one-off size through the shape-generic block's."""
        if use_graph:
            return self.graphs.run(inputs)
        return self.tail_graphs.run(inputs)

    @property
    def eager_calls(self) -> int:
        """Windows run without any graph (graphs off, or a capture that failed)."""
        return self.graphs.eager_calls + self.tail_graphs.eager_calls

    def _speaker_encoding(self, voice: str) -> torch.Tensor:
        if voice not in self._encoded:
            _, ref_mel = self.speakers[voice]
            ref2 = torch.cat([ref_mel, torch.zeros_like(ref_mel)])  # conditional, unconditional halves
            self._encoded[voice] = self.dit.input_embed.spk_encoder(ref2.to(self.dit_dtype))
        return self._encoded[voice]

    def _synthesize(self, code, noise, cond, encoded, block=None) -> torch.Tensor:
        """Codes [B, n] -> waveforms [B, samples], with no host syncs (capturable).

        ``cond`` is each row's speaker vector [B, 192]; ``encoded`` the ECAPA encoding of each
        row's reference mel, conditional rows first, then the unconditional ones [2B, dim].
        """
        mel = self._dit_sample(code, noise, cond, encoded, block)
        return self._bigvgan(mel)

    def _dit_sample(self, code, noise, cond, encoded, block=None) -> torch.Tensor:
        """``Qwen2_5OmniToken2WavDiTModel.sample``: classifier-free guidance, RK4 over fixed times."""
        dit = self.dit
        # The fixed-shape compile unless the caller picked one (the shape-generic one: one-off sizes).
        aligned_bias = block is None
        block = block or self.block
        frames = noise.shape[1]
        cond = cond.to(self.dit_dtype)
        speaker = cond.unsqueeze(1).repeat(1, frames, 1)
        speaker2 = torch.cat([speaker, torch.zeros_like(speaker)])
        ref_encoded = encoded.unsqueeze(1).repeat(1, frames, 1)
        code_embed = torch.cat([dit.text_embed(code, drop_code=False), dit.text_embed(code, drop_code=True)])
        constant = torch.cat((ref_encoded, code_embed, speaker2), dim=-1)
        rows = speaker2.shape[0]  # 2 x batch: conditional rows, then unconditional
        positions = torch.arange(frames, device=noise.device)[None, :].repeat(rows, 1)
        rotary = dit.rotary_embed(speaker2, positions)
        block_diff = dit._create_block_diff(speaker2)
        reaches = [(layer.look_backward_block, layer.look_ahead_block) for layer in dit.transformer_blocks]
        if aligned_bias:
            # One additive bias per distinct reach for the whole call, broadcast over rows and
            # heads: SDPA converted and padded a boolean mask at every layer of every evaluation
            # (792 times a window). Not for the shape-generic compile: its padded row stride is no
            # function of the frames it can express, so each new size would recompile it.
            biases = {
                reach: block_bias(block_diff[0, 0], *reach, self.dit_dtype).expand(block_diff.shape)
                for reach in set(reaches)
            }
            masks = [biases[reach] for reach in reaches]
        else:
            masks = [(block_diff >= -float(back)) & (block_diff <= float(ahead)) for back, ahead in reaches]

        stock = self._stock_dit

        def velocity(step: int, state: torch.Tensor) -> torch.Tensor:
            """The guided velocity at evaluation ``step`` (its time: ``evaluation_times[step]``)."""
            # The ODE state stays float32; the network runs in ``dit_dtype``.
            hidden = state.to(self.dit_dtype)
            x = dit.input_embed.proj(torch.cat((torch.cat([hidden, hidden]), constant), dim=-1))
            if stock:
                t = self.evaluation_times[step]
                t_emb = dit.time_embed(torch.full((rows,), t, device=noise.device, dtype=self.dit_dtype))
                for layer in dit.transformer_blocks:
                    x = block(layer, x, t_emb, rotary, block_diff, stock=True)
                x = dit.norm_out(x, t_emb)
            else:
                for index, (layer, mask) in enumerate(zip(dit.transformer_blocks, masks, strict=True)):
                    x = block(layer, x, self.modulation[step, index], rotary, mask)
                scale, shift = self.final_modulation[step].chunk(2)
                x = dit.norm_out.norm(x) * (1 + scale) + shift
            out = dit.proj_out(x).float()
            guided, null = torch.chunk(out, 2, dim=0)
            return guided + (guided - null) * self.guidance_scale

        state = noise
        # RungeKutta4ODESolver's steps: four evaluations each, in ``evaluation_times``' order
        for step, (t0, t1) in enumerate(itertools.pairwise(self.times)):
            dt, first = t1 - t0, 4 * step
            k1 = velocity(first, state)
            k2 = velocity(first + 1, state + dt * k1 / 3)
            k3 = velocity(first + 2, state + dt * (k2 - k1 / 3))
            k4 = velocity(first + 3, state + dt * (k1 - k2 + k3))
            state = state + (k1 + 3 * (k2 + k3) + k4) * dt / 8
        return state.permute(0, 2, 1)

    def _bigvgan(self, mel: torch.Tensor) -> torch.Tensor:
        """``Qwen2_5OmniToken2WavBigVGANModel.forward`` without its trailing ``.cpu()`` (a sync)."""
        model = self.bigvgan
        # process_mel_spectrogram, with its constant as a Python float (no tensor built mid-graph).
        db = 20 * torch.log10(torch.clamp(torch.exp(mel), min=MIN_AMPLITUDE)) - 20
        spectrogram = torch.clamp(2 * (db + 115) / 115 - 1, -1.0, 1.0)
        hidden = model.conv_pre(spectrogram)
        for index in range(model.num_upsample_layers):
            hidden = model.ups[index][0](hidden)
            blocks = model.resblocks[
                index * model.num_residual_blocks : (index + 1) * model.num_residual_blocks
            ]
            hidden = sum(block(hidden) for block in blocks) / model.num_residual_blocks
        wave = model.conv_post(model.activation_post(hidden))
        return torch.clamp(wave, min=-1.0, max=1.0).reshape(wave.shape[0], -1)


# The memory-efficient attention kernel reads a bias whose rows start at multiples of this many
# elements; SDPA copies any other bias into such a layout at every call.
BIAS_ALIGNMENT = 16


def block_bias(block_diff: torch.Tensor, back: float, ahead: float, dtype: torch.dtype) -> torch.Tensor:
    """The DiT's block attention mask as an additive bias: [frames, frames], 0 where frame i may
    attend frame j (its block within ``back`` blocks before and ``ahead`` after: transformers'
    ``block_diff >= -look_backward_block & block_diff <= look_ahead_block``) and -inf elsewhere,
    exactly what SDPA makes of the boolean mask. Its rows are padded in storage to a multiple of
    ``BIAS_ALIGNMENT`` so SDPA reads it as it is. ``block_diff``: [frames, frames]."""
    frames = block_diff.shape[-1]
    padded = -(-frames // BIAS_ALIGNMENT) * BIAS_ALIGNMENT
    bias = torch.full((frames, padded), float("-inf"), dtype=dtype, device=block_diff.device)
    allowed = (block_diff >= -float(back)) & (block_diff <= float(ahead))
    bias[:, :frames].masked_fill_(allowed, 0.0)
    return bias[:, :frames]


def evaluation_times(times: list[float]) -> list[float]:
    """The time of each of the ODE's evaluations, in the order ``_dit_sample`` makes them
    (``RungeKutta4ODESolver``: four per step, at t0, t0 + dt/3, t0 + 2dt/3 and t1)."""
    out = []
    for t0, t1 in itertools.pairwise(times):
        dt = t1 - t0
        out += [t0, t0 + dt / 3, t0 + dt * 2 / 3, t1]
    return out


@torch.inference_mode()
def modulations(dit: Any, times: list[float], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Every adaptive norm's parameters at every evaluation, from the time step alone:
    [evaluations, blocks, 6 x hidden] (each block's ``attn_norm``: shift, scale and gate for the
    attention, then for the feed-forward) and [evaluations, 2 x hidden] (``norm_out``: scale,
    shift). The time enters as the DiT's dtype, as ``torch.full(..., t, dtype=...)`` gives it."""
    t = torch.tensor(times, dtype=dit.proj_out.weight.dtype, device=device)
    embedded = dit.time_embed(t)
    blocks = torch.stack(
        [layer.attn_norm.linear(layer.attn_norm.silu(embedded)) for layer in dit.transformer_blocks], dim=1
    )
    final = dit.norm_out.linear(dit.norm_out.silu(embedded))
    return blocks.contiguous(), final.contiguous()


def fuse_qkv(dit: Any) -> None:
    """One linear for each attention's q, k and v (``attn.qkv``). The three original weights
    and biases become views of the fused ones: no second copy, and transformers' own forward
    (``stock_dit``) reads the same numbers."""
    for layer in dit.transformer_blocks:
        attn = layer.attn
        parts = (attn.to_q, attn.to_k, attn.to_v)
        weight = torch.cat([p.weight.detach() for p in parts])
        bias = torch.cat([p.bias.detach() for p in parts])
        fused = torch.nn.Linear(weight.shape[1], weight.shape[0], device="meta")
        fused.weight = torch.nn.Parameter(weight, requires_grad=False)
        fused.bias = torch.nn.Parameter(bias, requires_grad=False)
        attn.qkv = fused
        width = attn.to_q.weight.shape[0]
        for index, part in enumerate(parts):
            part.weight = torch.nn.Parameter(weight[index * width : (index + 1) * width], requires_grad=False)
            part.bias = torch.nn.Parameter(bias[index * width : (index + 1) * width], requires_grad=False)


def _dit_block(
    layer: Any,
    x: torch.Tensor,
    modulation: torch.Tensor,
    rotary: Any,
    mask: torch.Tensor,
    stock: bool = False,
) -> torch.Tensor:
    """``DiTDecoderLayer.forward`` with its norms' parameters (``modulation``, [6 x hidden]) and
    its attention mask precomputed; ``stock``: transformers' own forward, given the time
    embedding and the block differences instead."""
    if stock:
        return layer(x, modulation, position_embeddings=rotary, block_diff=mask)
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = modulation.chunk(6)
    norm = layer.attn_norm.norm(x) * (1 + scale_msa) + shift_msa
    x = x + gate_msa * _attention(layer.attn, norm, rotary, mask)
    norm = layer.ff_norm(x) * (1 + scale_mlp) + shift_mlp
    first, second = layer.ff.ff[0], layer.ff.ff[3]
    # tanh GELU (the module's ``approximate="tanh"``) in the GEMM's epilogue
    hidden = torch._addmm_activation(first.bias, norm.flatten(0, 1), first.weight.t(), use_gelu=True)
    return x + gate_mlp * second(hidden.view(*norm.shape[:2], -1))


def _attention(attn: Any, x: torch.Tensor, rotary: Any, mask: torch.Tensor) -> torch.Tensor:
    """``DiTAttention.forward`` with q, k and v from one GEMM: rotary on the first head only
    (de-interleaved first, as transformers does), then SDPA over the block mask."""
    batch, frames, _ = x.shape
    heads = attn.heads
    q, k, v = attn.qkv(x).view(batch, frames, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    cos, sin = rotary
    q_first, k_first = apply_rotary_pos_emb(
        deinterleave_head_dim(q[:, :1]), deinterleave_head_dim(k[:, :1]), cos, sin
    )
    q = torch.cat([q_first, q[:, 1:]], dim=1)
    k = torch.cat([k_first, k[:, 1:]], dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return attn.to_out[0](out.transpose(1, 2).reshape(batch, frames, -1))
