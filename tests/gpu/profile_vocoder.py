"""Where one streaming vocoder window (token2wav: DiT ODE + BigVGAN) spends its time on a GPU.

Builds only the released-size token2wav with random weights and reports, for the first (15
codes) and the steady (55 codes) window: the CUDA-graph replay, the eager run, and the kernels
that dominate a replay; then the throughput of steady windows batched across streams (1 to 16)
with the DiT in float32 (TF32 matmuls) and in bfloat16, and how far bfloat16's audio is from
float32's for the same window and seed (SNR). Run by hand on the device machine:

    python tests/gpu/profile_vocoder.py
    python tests/gpu/profile_vocoder.py --scale   # where a batch-16 steady call goes, DiT vs BigVGAN

``--scale`` (the bfloat16 DiT the runtime uses) measures audio-seconds per second by window size
(the first, second and steady windows' context sizes) and batch (up to 32), with transformers' DiT
block and with the runtime's; the kernel time and count of the DiT's ODE with each block (a
batch-16 steady call, one first window) and of BigVGAN; and BigVGAN with its fused activations
against transformers' own (time, difference).
"""

from __future__ import annotations

import sys
import time

import torch


def _timed(fn, reps: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1000 / reps


def _released_token2wav(device: torch.device):
    """The released 7B config and its token2wav at full size, random weights, float32."""
    from transformers import Qwen2_5OmniToken2WavModel

    from omni_runtime.models.qwen2_5_omni.loader import load_processor, released_7b_config

    config = released_7b_config(load_processor(None))
    with torch.device(device):
        token2wav = Qwen2_5OmniToken2WavModel._from_config(
            config.token2wav_config, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
    return config, token2wav


def main() -> int:
    if "--scale" in sys.argv:
        return scale()
    from torch.profiler import ProfilerActivity, profile
    from transformers import Qwen2_5OmniToken2WavModel

    from omni_runtime.models.qwen2_5_omni.loader import load_speakers
    from omni_runtime.models.qwen2_5_omni.vocoder import QwenVocoder

    device = torch.device("cuda", 0)
    config, token2wav = _released_token2wav(device)
    vocoder = QwenVocoder(token2wav, speakers=load_speakers(None, config), device=device)
    voice = next(iter(vocoder.speakers))
    print(f"DiT layers {len(vocoder.dit.transformer_blocks)}, ODE evaluations {4 * (len(vocoder.times) - 1)}")
    for n in (15, 55):
        codes = list(range(100, 100 + n))
        kwargs = dict(start=0, end=n, ctx_start=0, ctx_end=n, voice=voice, seed=0)
        graph_ms = _timed(lambda: vocoder.synthesize(codes, reusable=True, **kwargs))  # noqa: B023
        eager_ms = _timed(lambda: vocoder.synthesize(codes, reusable=False, **kwargs), reps=2)  # noqa: B023
        print(f"window {n} codes: graph {graph_ms:.1f} ms, eager {eager_ms:.1f} ms")
    codes = list(range(100, 115))
    kwargs = dict(start=0, end=15, ctx_start=0, ctx_end=15, voice=voice, seed=0, reusable=True)
    vocoder.synthesize(codes, **kwargs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        vocoder.synthesize(codes, **kwargs)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
    _batched_precision(config, device, load_speakers(None, config), Qwen2_5OmniToken2WavModel, QwenVocoder)
    return 0


def _batched_precision(config, device, speakers, model_class, vocoder_class) -> None:
    """Steady windows (40 kept codes, 55 with context) per second of audio, by batch and DiT dtype."""
    import numpy as np

    torch.manual_seed(0)
    with torch.device(device):
        token2wav = model_class._from_config(
            config.token2wav_config, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
    state = {k: v.clone() for k, v in token2wav.state_dict().items()}
    rng = np.random.default_rng(0)
    codes = [int(c) for c in rng.integers(0, 8000, 55)]
    reference = None
    for dtype in (torch.float32, torch.bfloat16):
        token2wav.load_state_dict(state)  # the same weights for both precisions
        token2wav.float()
        vocoder = vocoder_class(token2wav, speakers=speakers, device=device, dit_dtype=dtype)
        voice = next(iter(vocoder.speakers))
        window = {"start": 10, "end": 50, "ctx_start": 0, "ctx_end": 55}
        for rows in (1, 4, 8, 16):
            items = [
                {"codes": codes, "window": window, "voice": voice, "seed": i, "reusable": True}
                for i in range(rows)
            ]
            ms = _timed(lambda v=vocoder, batch=items: v.synthesize_many(batch))
            audio_s = rows * 40 * vocoder.samples_per_code / vocoder.sample_rate
            print(
                f"DiT {dtype!s:15s} batch {rows:2d}: {ms:7.1f} ms per call, {audio_s / ms * 1000:6.1f} audio-s/s"
            )
        wave = vocoder.synthesize_many(
            [{"codes": codes, "window": window, "voice": voice, "seed": 7, "reusable": True}]
        )[0]
        if reference is None:
            reference = wave
        else:
            noise = float(np.sum((wave - reference) ** 2))
            signal = float(np.sum(reference**2))
            print(
                f"bfloat16 vs float32 DiT, same window and seed: SNR {10 * np.log10(signal / max(noise, 1e-20)):.1f} dB"
            )
        del vocoder
        torch.cuda.empty_cache()


def scale() -> int:
    import copy

    import numpy as np
    from torch.profiler import ProfilerActivity, profile

    from omni_runtime.models.qwen2_5_omni import vocoder as vocoder_module
    from omni_runtime.models.qwen2_5_omni.loader import load_speakers

    vocoder_module.MAX_BATCH = 32
    torch.manual_seed(0)
    device = torch.device("cuda", 0)
    config, token2wav = _released_token2wav(device)
    stock_bigvgan = copy.deepcopy(
        token2wav.code2wav_bigvgan_model
    )  # before the vocoder fuses its activations
    vocoder = vocoder_module.QwenVocoder(
        token2wav, speakers=load_speakers(None, config), device=device, dit_dtype=torch.bfloat16
    )
    vocoder.graphs.buckets = vocoder.tail_graphs.buckets = (1, 2, 4, 8, 16, 32)
    voice = next(iter(vocoder.speakers))
    rng = np.random.default_rng(0)
    codes = [int(c) for c in rng.integers(0, 8000, 200)]

    def items(ctx: int, kept: int, rows: int) -> list[dict]:
        window = {"start": ctx - 5 - kept, "end": ctx - 5, "ctx_start": 0, "ctx_end": ctx}
        return [
            {"codes": codes, "window": window, "voice": voice, "seed": i, "reusable": True}
            for i in range(rows)
        ]

    # (context codes, kept codes, batches): the first window, the second, the steady 40 codes;
    # each with transformers' DiT block (per evaluation: time embedding, adaptive-norm linears,
    # three q/k/v GEMMs, GELU apart) and with the runtime's (vocoder.py: the modulation table, one
    # q/k/v GEMM, GELU in the GEMM's epilogue), same weights, same process.
    for stock in (True, False):
        vocoder.stock_dit = stock  # drops the other block's graphs
        label = "transformers' block" if stock else "runtime's block"
        for ctx, kept, batches in ((15, 10, (1, 4, 16)), (25, 10, (1, 16)), (55, 40, (1, 8, 16, 32))):
            for rows in batches:
                batch = items(ctx, kept, rows)
                ms = _timed(lambda b=batch: vocoder.synthesize_many(b), reps=3)
                audio_s = rows * kept * vocoder.samples_per_code / vocoder.sample_rate
                print(
                    f"{label:20s} window ctx {ctx:3d} kept {kept:3d} batch {rows:2d}: {ms:7.1f} ms per call, "
                    f"{audio_s / ms * 1000:6.1f} audio-s/s",
                    flush=True,
                )
    # The DiT's ODE of a batch-16 steady call and of one first window, run eagerly (compiled DiT
    # block), kernel time and kernel count of each block; then BigVGAN's share of the steady call.
    mels = {}
    with torch.inference_mode():
        for stock in (True, False):
            vocoder.stock_dit = stock
            label = "transformers' block" if stock else "runtime's block"
            for name, inputs in (
                ("DiT ODE, batch 16 steady", vocoder.inputs(items(55, 40, 16))),
                ("DiT ODE, one first window", vocoder.inputs(items(15, 10, 1))),
            ):
                mels[stock, name] = vocoder._dit_sample(**inputs).float()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    vocoder._dit_sample(**inputs)
                    torch.cuda.synchronize()
                events = prof.key_averages()
                total = sum(e.device_time_total for e in events) / 1000
                kernels = sum(e.count for e in events if e.device_time_total > 0)
                print(f"{label}, {name}: {total:.1f} ms of kernels, {kernels} kernels")
                if "steady" in name:
                    print(events.table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70))
        for name in ("DiT ODE, batch 16 steady", "DiT ODE, one first window"):
            ours, theirs = mels[False, name], mels[True, name]
            snr = 10 * torch.log10((theirs**2).sum() / ((ours - theirs) ** 2).sum().clamp_min(1e-30))
            print(
                f"{name}: runtime's block vs transformers' mel, max |difference| "
                f"{float((ours - theirs).abs().max()):.2e}, SNR {float(snr):.1f} dB"
            )
        vocoder.stock_dit = False
        batch = items(55, 40, 16)
        inputs = vocoder.inputs(batch)
        mel = vocoder._dit_sample(**inputs)
        vocoder._bigvgan(mel)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            vocoder._bigvgan(mel)
            torch.cuda.synchronize()
        events = prof.key_averages()
        print(
            f"BigVGAN: {sum(e.device_time_total for e in events) / 1000:.1f} ms of kernels (batch 16 steady)"
        )
        # transformers' own activations (a copy taken before the vocoder fused them), same mel.
        fused_module = vocoder.bigvgan
        fused_ms = _timed(lambda: vocoder._bigvgan(mel), reps=3)
        wave = vocoder._bigvgan(mel).float().cpu().numpy()
        vocoder.bigvgan = stock_bigvgan
        stock_ms = _timed(lambda: vocoder._bigvgan(mel), reps=3)
        reference = vocoder._bigvgan(mel).float().cpu().numpy()
        vocoder.bigvgan = fused_module
        diff = float(np.abs(wave - reference).max())
        snr = 10 * np.log10(np.sum(reference**2) / max(float(np.sum((wave - reference) ** 2)), 1e-30))
        print(
            f"BigVGAN eager, batch 16 steady: stock activations {stock_ms:.1f} ms, fused {fused_ms:.1f} ms; "
            f"max |difference| {diff:.2e}, SNR {snr:.1f} dB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
