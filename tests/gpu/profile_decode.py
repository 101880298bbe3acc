"""Where a thinker decode step spends its time on a GPU (run by hand on the device machine).

For each batch size and each decode path (eager layers, ``torch.compile``d layers) it reports:
the graph replay alone (GPU time of one step, no host work between replays), the whole runtime
step (replay + sampling + the host round trip), and the kernels that dominate a replay.

    python tests/gpu/profile_decode.py --batches 1,4 --out /tmp/decode-profile.txt
    python tests/gpu/profile_decode.py --family qwen3_omni_moe --batches 1,8   # per experts kernel
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from omni_runtime.bench.decode import _build, bench_runtime
from omni_runtime.executor import slot_cache


def _replay_ms(runner, batch: int, view_len: int, reps: int = 50) -> float:
    decoder = runner.decoder
    decoder.decode(batch, max_length=view_len)  # capture (or warm) the bucket
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        decoder.decode(batch, max_length=view_len)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1000 / reps


def _top_kernels(runner, batch: int, view_len: int, limit: int = 18) -> str:
    from torch.profiler import ProfilerActivity, profile

    decoder = runner.decoder
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            decoder.decode(batch, max_length=view_len)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=limit, max_name_column_width=70)
    return table


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--out", default=None)
    parser.add_argument("--family", default="qwen2_5_omni", choices=["qwen2_5_omni", "qwen3_omni_moe"])
    parser.add_argument(
        "--experts",
        default="omni_fused+qkv,grouped_mm",
        help="qwen3_omni_moe: kernels profiled (+qkv: fused q/k/v)",
    )
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    if args.family == "qwen3_omni_moe":
        from omni_runtime.bench.decode_moe import build, set_experts

        thinker, make_runner, vocab, _, _ = build("bfloat16", max_len=1024, slots=max(batches))
        for kernel in args.experts.split(","):
            runner = make_runner(kernel)
            for batch in batches:
                set_experts(thinker, kernel)
                step_ms = bench_runtime(runner, batch=batch, prompt=128, steps=64, vocab=vocab)
                replay_ms = _replay_ms(runner, batch, 200)
                say(f"{kernel:10s} batch {batch:3d}: step {step_ms:6.2f} ms, replay only {replay_ms:6.2f} ms")
                say(_top_kernels(runner, batch, 200, limit=25))
            del runner
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
        return 0
    thinker, runner = _build("bfloat16", max_len=1024, slots=max(batches))
    vocab = thinker.config.text_config.vocab_size
    variants = {"eager": list(runner.decoder.layers), "compiled": slot_cache._compiled(runner.decoder.layers)}
    for name, layers in variants.items():
        runner.decoder.step_layers = layers
        runner.decoder._graphs.clear()
        for batch in batches:
            step_ms = bench_runtime(runner, batch=batch, prompt=128, steps=64, vocab=vocab)
            replay_ms = _replay_ms(runner, batch, 200)
            say(f"{name:9s} batch {batch:3d}: step {step_ms:6.2f} ms, replay only {replay_ms:6.2f} ms")
            if batch in (1, max(batches)):
                say(_top_kernels(runner, batch, 200))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
