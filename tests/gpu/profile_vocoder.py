"""Where one streaming vocoder window (token2wav: DiT ODE + BigVGAN) spends its time on a GPU.

Builds only the released-size token2wav with random weights and reports, for the first (15
codes) and the steady (55 codes) window: the CUDA-graph replay, the eager run, and the kernels that dominate a replay. Run by hand on the device machine:

    python tests/gpu/profile_vocoder.py
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


def main() -> int:
    from torch.profiler import ProfilerActivity, profile
    from transformers import Qwen2_5OmniToken2WavModel

    from omni_runtime.models.qwen2_5_omni.loader import load_processor, load_speakers, released_7b_config
    from omni_runtime.models.qwen2_5_omni.vocoder import QwenVocoder

    config = released_7b_config(load_processor(None))
    device = torch.device("cuda", 0)
    with torch.device(device):
        token2wav = Qwen2_5OmniToken2WavModel._from_config(
            config.token2wav_config, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
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
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
