"""Where the fused MoE decode layer's time goes when its kernels run as a PDL chain (issue 17),
from the kernels' own start and end times in a profiler trace of graph-replayed decode steps. Run
by hand on the device machine:

    python tests/gpu/layer_chain.py --builds omni_fused+qkv+pdl,omni_fused+qkv+layer
    python tests/gpu/layer_chain.py --builds "omni_fused+qkv+pdl,omni_fused+qkv+pdl:ROW_O=0"

A build may name module values to set first (``:NAME=INT;NAME=INT``, executor.moe_layer's,
moe_experts' or row_gemv's, as tests/gpu/sweep_moe_layer.py sets them). A one-row step with the
CUDA kernels is a layer of four (q/k/v, attention, o, the MoE block); the Triton chain's is six.

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
from omni_runtime.executor import moe_experts, moe_layer, row_gemv

# A layer's kernels (each a set of the kernel names that may take that place) and their names.
LAYERS = (
    (
        ({"gemv_kernel"}, {"attention_kernel"}, {"gemv_kernel"}, {"router_kernel"}, {"gate_up_kernel"},
         {"experts_down_kernel"}),
        ("qkv", "attention", "o", "router", "gate_up", "down"),
    ),
    (
        ({"gemv_kernel"}, {"attention_kernel"}, {"gemv_kernel", "row_gemv"}, {"moe_experts_row"}),
        ("qkv", "attention", "o", "moe"),
    ),
)  # fmt: skip


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
    """The table for whichever of ``LAYERS`` the kernels run as (the one found most often)."""
    tables = [_chain_table(kernels, layer, names) for layer, names in LAYERS]
    return max(tables, key=lambda t: int(t[0].split()[0]))


def _chain_table(
    kernels: list[tuple[str, float, float]], layer: tuple[set[str], ...], names: tuple[str, ...]
) -> list[str]:
    added: dict[str, list[float]] = defaultdict(list)
    own: dict[str, list[float]] = defaultdict(list)
    early: dict[str, list[float]] = defaultdict(list)
    layers = 0
    in_layers: set[int] = set()
    i = 0
    while i + len(layer) <= len(kernels):
        window = kernels[i : i + len(layer)]
        if i == 0 or not all(k[0] in allowed for k, allowed in zip(window, layer, strict=True)):
            i += 1
            continue
        previous_end = kernels[i - 1][2]
        for name, (_, start, end) in zip(names, window, strict=True):
            added[name].append(end - previous_end)
            own[name].append(end - start)
            early[name].append(previous_end - start)
            previous_end = end
        layers += 1
        in_layers.update(range(i, i + len(layer)))
        i += len(layer)
    if not layers:
        return ["0 layers"]
    lines = [f"{layers} layers; medians in µs", f"{'kernel':10} {'added':>7} {'own':>7} {'early':>7}"]
    for name in names:
        lines.append(
            f"{name:10} {statistics.median(added[name]):7.2f} {statistics.median(own[name]):7.2f} "
            f"{statistics.median(early[name]):7.2f}"
        )
    total = sum(statistics.median(added[name]) for name in names)
    lines.append(f"{'layer':10} {total:7.2f}")
    # What the profiled steps ran besides their layers (the LM head, the sampling, the embedding..).
    others: dict[str, float] = defaultdict(float)
    for at in sorted(set(range(len(kernels))) - in_layers):
        name, start, end = kernels[at]
        others[name[:60]] += end - start
    lines.append(f"besides the layers, kernels' own µs summed over the {layers} layers' steps:")
    for name, spent in sorted(others.items(), key=lambda kv: -kv[1])[:8]:
        lines.append(f"  {spent:9.1f}  {name}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--builds", default="omni_fused+qkv+pdl,omni_fused+qkv+layer")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    _thinker, make_runner, vocab, _, _ = build("bfloat16", max_len=1024, slots=args.batch)
    lines: list[str] = []
    for build_spec in args.builds.split(","):
        kernel, _, values = build_spec.partition(":")
        for setting in filter(None, values.split(";")):
            name, value = setting.split("=")
            module = next(m for m in (moe_layer, moe_experts, row_gemv) if hasattr(m, name))
            setattr(module, name, type(getattr(module, name))(int(value)))
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
        lines += [f"{build_spec}, batch {args.batch}: {ms:.3f} ms a step unprofiled", *table, ""]
        print("\n".join(lines[-len(table) - 2 :]), flush=True)
        del runner
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
