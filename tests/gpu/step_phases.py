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
import dataclasses
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import test_moe_step_cuda as case
from cuda_graphs import capture

from omni_runtime.executor import moe_step
from omni_runtime.models.qwen3_omni_moe.decode_layer import fused_decode_stack

MARKS = (
    "layer start", "input read", "q/k/v rows here", "q/k/v published", "attention inputs read",
    "split done", "merged, published", "attention output read", "o published", "mid read",
    "logit published", "routed", "gate-up done", "activations read", "down rows here", "layer end",
    "attention keys done", "-", "q/k/v computed", "q/k/v fenced", "down computed", "next q/k/v asked",
    "output published", "output fenced", "o computed",
)  # fmt: skip


def timed(fn, repeats: int = 50) -> float:
    """µs a replay of a CUDA graph of ``fn`` (so the layer kernels' launches cost no host time)."""
    with torch.no_grad():
        graph = capture(fn)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / repeats


def per_layer(make, depth: int) -> tuple[float, float]:
    """(µs a layer: LAYERS layers less one, over the layers between; µs for one layer)."""
    one, many = timed(make(1)), timed(make(depth))
    return (many - one) / (depth - 1), one


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cached", default="128,2048")
    parser.add_argument(
        "--vary", action="append", default=[], help="NAME=V1,V2: a StepPlan field's values to time"
    )
    args = parser.parse_args()
    text, _, rotary, fused, whole = case.build_stack()
    one = fused_decode_stack(fused[:1], pdl=True)
    for vary in args.vary:
        name, values = vary.split("=")
        for value in [int(v) for v in values.split(",")]:
            plan = dataclasses.replace(whole.plan, **{name: value})
            for write in [int(c) for c in args.cached.split(",")]:
                hidden, cos_sin, _mask = case._inputs(text, rotary, write)
                caches = {n: case._cache(text, write, n) for n in (1, case.LAYERS)}
                steps = {n: moe_step.RowStep(plan, whole.layers[:n]) for n in (1, case.LAYERS)}

                def of(n, steps=steps, hidden=hidden, cos_sin=cos_sin, caches=caches):
                    return lambda: steps[n](hidden, cos_sin, caches[n])

                print(
                    f"{name}={value}, {write} cached: step kernel {per_layer(of, case.LAYERS)[0]:.1f} µs a layer"
                )
    depth = case.LAYERS
    for write in [int(c) for c in args.cached.split(",")]:
        hidden, cos_sin, mask = case._inputs(text, rotary, write)
        caches = {n: case._cache(text, write, n) for n in (1, depth)}

        def step_of(n, hidden=hidden, cos_sin=cos_sin, caches=caches):
            kernel = whole if n == depth else one
            return lambda: kernel(hidden, cos_sin, caches[n])

        def layers_of(n, hidden=hidden, cos_sin=cos_sin, mask=mask, caches=caches):
            return lambda: case._layers(fused[:n], hidden, cos_sin, mask, caches[n])

        per_step, step_one = per_layer(step_of, depth)
        per_fused, fused_one = per_layer(layers_of, depth)
        print(f"cached {write}: step kernel {per_step:.1f} µs a layer ({step_one:.1f} for one layer); "
              f"layer kernels {per_fused:.1f} µs a layer ({fused_one:.1f} for one)")  # fmt: skip
        blocks = whole.plan.blocks
        trace = torch.zeros(2 * blocks, 32, dtype=torch.int64, device="cuda")
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
                print(
                    f"  block {block} gave up waiting: code {int(gave_up[block, 0])}, saw {int(gave_up[block, 1])}"
                )
        origin = int(marks[:, 0].min())
        picked = (0, 1, 4, 25, 102, 115, 127)  # attention blocks, and q, k and v rows' blocks of head 0
        header = "".join(f" {'block ' + str(b):>9}" for b in picked)
        print(
            f"  {'phase (layer 1)':<24} {'first µs':>9} {'median µs':>10} {'slowest µs':>11} {'blocks':>7}{header}"
        )
        for at, name in enumerate(MARKS):
            seen = [int(v) - origin for v in marks[:, at].tolist() if v]
            if seen:
                each = "".join(
                    f" {(int(marks[b, at]) - origin) / 1000 if marks[b, at] else float('nan'):>9.2f}"
                    for b in picked
                )
                print(
                    f"  {name:<24} {min(seen) / 1000:>9.2f} {statistics.median(seen) / 1000:>10.2f} "
                    f"{max(seen) / 1000:>11.2f} {len(seen):>7}{each}"
                )


if __name__ == "__main__":
    main()
