"""What one kernel boundary costs on this GPU, against a global barrier inside one persistent
kernel (issue 17: the fused MoE decode layer is a chain of six kernels, 288 a step). Run by hand on
the device machine:

    python tests/gpu/boundary_cost.py

Three ways to run ``PHASES`` dependent phases of tiny work (each program adds one to its own
element, so every phase depends on the one before):

- ``kernels``: one kernel a phase, captured in a CUDA graph (the layer without PDL);
- ``pdl``: the same launched as programmatic dependents, each waiting (griddepcontrol.wait)
  before it reads (the layer with ``OMNI_MOE_LAYER=pdl``);
- ``barrier``: one kernel of one program per SM, the phases separated by a counter every
  program arrives at and spins on (a persistent kernel).

Printed: microseconds a phase for each, and the grid sizes tried.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from cuda_graphs import capture
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def phase_kernel(x_ptr, PDL: tl.constexpr):
    pid = tl.program_id(0)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    tl.store(x_ptr + pid, tl.load(x_ptr + pid) + 1)


@triton.jit
def barrier_kernel(x_ptr, count_ptr, programs, PHASES: tl.constexpr):
    pid = tl.program_id(0)
    for phase in range(PHASES):
        tl.store(x_ptr + pid, tl.load(x_ptr + pid, volatile=True) + 1)
        tl.atomic_add(count_ptr, 1, sem="release")
        target = (phase + 1) * programs
        seen = tl.atomic_add(count_ptr, 0, sem="acquire")
        while seen < target:
            seen = tl.atomic_add(count_ptr, 0, sem="acquire")


def time_graph(fn, repeats: int) -> float:
    """Milliseconds a replay of ``fn`` captured in a CUDA graph takes (best of ``repeats``)."""
    graph = capture(fn)
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--phases", type=int, default=288, help="dependent phases (6 kernels x 48 layers)")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(0), f"{sms} SMs, {args.phases} phases")
    for programs in (16, sms, 4 * sms):
        x = torch.zeros(programs, dtype=torch.int32, device="cuda")

        def chain(pdl: bool, x=x, programs=programs) -> None:
            extra = {"launch_pdl": True} if pdl else {}
            for _ in range(args.phases):
                phase_kernel[(programs,)](x, PDL=pdl, **extra)

        for name, pdl in (("kernels", False), ("pdl", True)):
            ms = time_graph(lambda pdl=pdl: chain(pdl), args.repeats)
            print(f"{name:8} {programs:4} programs: {1000 * ms / args.phases:6.2f} us a phase")
        if programs <= sms:  # every program resident: the spin cannot starve one that never ran
            count = torch.zeros(1, dtype=torch.int32, device="cuda")

            def persistent(x=x, count=count, programs=programs) -> None:
                count.zero_()
                barrier_kernel[(programs,)](x, count, programs, PHASES=args.phases)

            ms = time_graph(persistent, args.repeats)
            print(f"barrier  {programs:4} programs: {1000 * ms / args.phases:6.2f} us a phase")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
