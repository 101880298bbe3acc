"""Where the one-kernel decode step's layer time goes (executor.moe_step.cu), by hand on a GPU:

    python tests/gpu/step_phases.py --cached 128,2048

Builds LAYERS layers of the released Qwen3-Omni-30B-A3B thinker's shape with random weights (as
test_moe_step_cuda.py does), then for each cached length: µs a layer of the step kernel and of the
fused layer kernels (the difference between LAYERS layers and one, over 50 launches each), and the
step kernel's phase marks in layer 1 (each block's global timer at its phase points; the median
and the slowest block, µs after the earliest block's layer start). A wait that gave up (after 4M
polls) is printed with what it saw.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import test_moe_step_cuda as case  # noqa: E402

from omni_runtime.models.qwen3_omni_moe.decode_layer import fused_decode_stack  # noqa: E402

MARKS = (
    "layer start", "input read", "q/k/v rows here", "q/k/v published", "attention inputs read",
    "split done", "merged, published", "attention output read", "o published", "mid read",
    "logit published", "routed", "gate-up done", "activations read", "down rows here", "layer end",
)  # fmt: skip


def timed(fn, repeats: int = 50) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / repeats  # µs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cached", default="128,2048")
    args = parser.parse_args()
    text, layers, rotary, fused, whole = case.build_stack()
    one = fused_decode_stack(fused[:1], pdl=True)
    depth = case.LAYERS
    for write in [int(c) for c in args.cached.split(",")]:
        hidden, cos_sin, mask = case._inputs(text, rotary, write)
        caches = {n: case._cache(text, write, n) for n in (1, depth)}
        with torch.no_grad():
            step_us = {n: timed(lambda n=n: (whole if n == depth else one)(hidden, cos_sin, caches[n])) for n in (1, depth)}
            layer_us = {n: timed(lambda n=n: case._layers(fused[:n], hidden, cos_sin, mask, caches[n])) for n in (1, depth)}
        per_step = (step_us[depth] - step_us[1]) / (depth - 1)
        per_layer = (layer_us[depth] - layer_us[1]) / (depth - 1)
        print(f"cached {write}: step kernel {per_step:.1f} µs a layer ({step_us[1]:.1f} for one layer); "
              f"layer kernels {per_layer:.1f} µs a layer ({layer_us[1]:.1f} for one)")  # fmt: skip
        blocks = whole.plan.blocks
        trace = torch.zeros(2 * blocks, 16, dtype=torch.int64, device="cuda")
        whole.trace = trace
        try:
            with torch.no_grad():
                whole(hidden, cos_sin, caches[depth])
            torch.cuda.synchronize()
        finally:
            whole.trace = None
        marks = trace[:blocks].cpu()
        gave_up = trace[blocks:].cpu()
        for block in range(blocks):
            if gave_up[block, 0]:
                print(f"  block {block} gave up waiting: code {int(gave_up[block, 0])}, saw {int(gave_up[block, 1])}")
        origin = int(marks[:, 0].min())
        print(f"  {'phase (layer 1)':<24} {'median µs':>10} {'slowest µs':>11} {'blocks':>7}")
        for at, name in enumerate(MARKS):
            seen = [int(v) - origin for v in marks[:, at].tolist() if v]
            if seen:
                print(f"  {name:<24} {statistics.median(seen) / 1000:>10.2f} {max(seen) / 1000:>11.2f} {len(seen):>7}")


if __name__ == "__main__":
    main()
