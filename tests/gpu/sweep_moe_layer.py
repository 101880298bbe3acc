"""The fused MoE decode layer's launch shapes on a GPU (run by hand on the device machine): the
thinker decode step at batch 1 (and 4) for each shape, then a kernel profile of the best one
without PDL (with PDL a kernel's time includes its wait for the one before: layer_chain.py says
what each kernel adds to the PDL chain).

    python tests/gpu/sweep_moe_layer.py --out /tmp/sweep.txt
    python tests/gpu/sweep_moe_layer.py --batches 1 --prompt 2048   # after 2048 cached tokens
"""

from __future__ import annotations

import argparse
import itertools
import os
from typing import Any

from omni_runtime.bench.decode import bench_runtime
from omni_runtime.bench.decode_moe import build
from omni_runtime.executor import moe_experts, moe_layer, row_gemv

# Each shape: overrides of executor.moe_layer's, moe_experts' or row_gemv's launch values (the first
# and last: as served). MERGE_CHUNK: the splits the attention's last program merges a round;
# KEYS_PER_SPLIT: the least keys an attention split walks (served 64; 256: one split, which writes
# its row itself, up to 256 cached keys). Run with --prompt 2048 too: the merge is longer there.
SHAPES: list[dict[str, Any]] = [
    {},
    {"MERGE_CHUNK": 1},
    {"KEYS_PER_SPLIT": 128},
    {"KEYS_PER_SPLIT": 256},
    {"MERGE_CHUNK": 1},
    {},
]


def _module(name: str) -> Any:
    return next(m for m in (moe_layer, moe_experts, row_gemv) if hasattr(m, name))


# Each value a module attribute of moe_layer or moe_experts, or an OMNI_ switch (the environment).
SERVED = {
    name: os.environ.get(name) if name.startswith("OMNI_") else getattr(_module(name), name)
    for shape in SHAPES
    for name in shape
}


def apply(shape: dict[str, Any]) -> None:
    for name, value in (SERVED | shape).items():
        if not name.startswith("OMNI_"):
            setattr(_module(name), name, value)
        elif value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--builds", default="omni_fused+qkv+pdl")
    parser.add_argument("--shapes", type=int, default=len(SHAPES), help="the first N shapes only")
    parser.add_argument("--prompt", type=int, default=128, help="cached tokens before the timed steps")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    _thinker, make_runner, vocab, _, _ = build("bfloat16", max_len=args.prompt + 512, slots=max(batches))
    lines = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    results = []
    for shape, kernel in itertools.product(SHAPES[: args.shapes], args.builds.split(",")):
        apply(shape)
        try:
            runner = make_runner(kernel)
            row = [bench_runtime(runner, batch=b, prompt=args.prompt, steps=48, vocab=vocab) for b in batches]
        except Exception as exc:  # one shape that fails to launch must not end the sweep
            say(f"{kernel} {shape}: failed: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        results.append((row[0], shape, kernel))
        say(
            f"{kernel} {shape}: "
            + ", ".join(f"batch {b} {ms:.3f} ms" for b, ms in zip(batches, row, strict=True))
        )
        del runner
    best = min(results, key=lambda r: r[0])
    say(f"best at batch 1: {best[2]} {best[1]} {best[0]:.3f} ms")
    apply(best[1])
    import torch
    from torch.profiler import ProfilerActivity, profile

    runner = make_runner("omni_fused+qkv+layer")
    bench_runtime(runner, batch=1, prompt=128, steps=8, vocab=vocab)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            runner.decoder.decode(1, max_length=200)
        torch.cuda.synchronize()
    say(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=50))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
