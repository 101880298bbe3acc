"""Where the fused MoE decode layer's time goes when its kernels run as a PDL chain (issue 17),
from the kernels' own start and end times in a profiler trace of graph-replayed decode steps. Run
by hand on the device machine:

    python tests/gpu/layer_chain.py --builds omni_fused+qkv+pdl,omni_fused+qkv+layer

A kernel's own time (end - start) includes, with PDL, the time its programs wait for the kernel
before; what it adds to the chain is the time from the previous kernel's end to its own end. Per
kernel of the layer, printed: that added time, its own time, and how early it started (the
previous kernel's end - its start; negative: a gap). Medians over the middle layers of the
profiled steps; the sum of the added times is the layer's time in the chain.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from omni_runtime.bench.decode import bench_runtime
from omni_runtime.bench.decode_moe import build

LAYER = (
    "gemv_kernel",
    "attention_kernel",
    "gemv_kernel",
    "router_kernel",
    "gate_up_kernel",
    "experts_down_kernel",
)
NAMES = ("qkv", "attention", "o", "router", "gate_up", "down")


def kernels_of(trace: Path) -> list[tuple[str, float, float]]:
    """(name, start µs, end µs) of every GPU kernel in a chrome trace, by start."""
    events = json.loads(trace.read_text())["traceEvents"]
    found = [
        (e["name"], float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in events
        if e.get("cat") == "kernel" and "dur" in e
    ]
    return sorted(found, key=lambda k: k[1])


def chain_table(kernels: list[tuple[str, float, float]]) -> list[str]:
    added: dict[str, list[float]] = defaultdict(list)
    own: dict[str, list[float]] = defaultdict(list)
    early: dict[str, list[float]] = defaultdict(list)
    layers = 0
    i = 0
    while i + len(LAYER) <= len(kernels):
        window = kernels[i : i + len(LAYER)]
        if i == 0 or tuple(k[0] for k in window) != LAYER:
            i += 1
            continue
        previous_end = kernels[i - 1][2]
        for name, (_, start, end) in zip(NAMES, window, strict=True):
            added[name].append(end - previous_end)
            own[name].append(end - start)
            early[name].append(previous_end - start)
            previous_end = end
        layers += 1
        i += len(LAYER)
    lines = [f"{layers} layers; medians in µs", f"{'kernel':10} {'added':>7} {'own':>7} {'early':>7}"]
    for name in NAMES:
        lines.append(
            f"{name:10} {statistics.median(added[name]):7.2f} {statistics.median(own[name]):7.2f} "
            f"{statistics.median(early[name]):7.2f}"
        )
    total = sum(statistics.median(added[name]) for name in NAMES)
    lines.append(f"{'layer':10} {total:7.2f}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--builds", default="omni_fused+qkv+pdl,omni_fused+qkv+layer")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    _thinker, make_runner, vocab, _, _ = build("bfloat16", max_len=1024, slots=args.batch)
    lines: list[str] = []
    for kernel in args.builds.split(","):
        runner = make_runner(kernel)
        ms = bench_runtime(runner, batch=args.batch, prompt=128, steps=48, vocab=vocab)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                runner.decoder.decode(args.batch, max_length=200)
            torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(trace))
            table = chain_table(kernels_of(trace))
        lines += [f"{kernel}, batch {args.batch}: {ms:.3f} ms a step unprofiled", *table, ""]
        print("\n".join(lines[-len(table) - 2 :]), flush=True)
        del runner
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
