"""Whether a programmatic dependent's weight reads overlap the kernel before it, on this GPU, in a
CUDA graph (issue 17: each of the fused MoE layer's kernels loads its weights before
``griddepcontrol.wait``, counting on PDL to stream them while the kernel before still runs).
Run by hand on the device machine:

    python tests/gpu/pdl_overlap.py

``LAYERS`` pairs of kernels, as the layer's attention and o projection: ``busy`` (128 programs of
4 warps, a chain of dependent multiply-adds with HBM idle) then ``read`` (a matrix-vector product
over a 2048 x 4096 bfloat16 matrix, 16.8 MB, 8 rows a program), each pair with its own matrix so
the reads come from HBM. Printed: microseconds a pair for each kernel alone, both as plain
kernels, and both with ``read`` a programmatic dependent that loads its rows before its wait
(``early``) or after it (``late``), and both as one kernel whose reading programs spin until
the busy ones are done (``one kernel``). If the early loads overlap ``busy``, a pair takes about
the longer of the two, not their sum.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from boundary_cost import time_graph  # tests/gpu, beside this script
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _now():
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def _mark(t_ptr, at, TRACE: tl.constexpr):
    """With ``TRACE``, the GPU's global timer (ns) at ``t_ptr[at]``."""
    if TRACE:
        tl.store(t_ptr + at, _now())


@triton.jit
def busy_kernel(x_ptr, steps, t_ptr, PDL: tl.constexpr, TRIGGER_LATE: tl.constexpr = False,
                TRACE: tl.constexpr = False):  # fmt: skip
    pid = tl.program_id(0)
    _mark(t_ptr, pid * 3, TRACE)
    if PDL:
        gdc_wait()
        if not TRIGGER_LATE:
            gdc_launch_dependents()
    _mark(t_ptr, pid * 3 + 1, TRACE)
    v = tl.load(x_ptr + pid * 32 + tl.arange(0, 32))
    for _ in range(steps):
        v = v * 0.999 + 0.001
    if PDL and TRIGGER_LATE:
        gdc_launch_dependents()
    tl.store(x_ptr + pid * 32 + tl.arange(0, 32), v)
    _mark(t_ptr, pid * 3 + 2, TRACE)


@triton.jit
def _nap(seen):
    return tl.inline_asm_elementwise("nanosleep.u32 256; mov.u32 $0, $1;", "=r,r", [seen], dtype=tl.int32,
                                     is_pure=False, pack=1)  # fmt: skip


@triton.jit
def read_kernel(w_ptr, x_ptr, out_ptr, t_ptr, K: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
                EARLY: tl.constexpr, TRIGGER_LATE: tl.constexpr = False, TRACE: tl.constexpr = False):  # fmt: skip
    pid = tl.program_id(0)
    _mark(t_ptr, pid * 3, TRACE)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, K)
    if EARLY:
        w = tl.load(w_ptr + n[:, None] * K + k[None, :])
    if PDL:
        gdc_wait()
        if not TRIGGER_LATE:
            gdc_launch_dependents()
    _mark(t_ptr, pid * 3 + 1, TRACE)
    if not EARLY:
        w = tl.load(w_ptr + n[:, None] * K + k[None, :])
    x = tl.load(x_ptr + k)
    tl.store(out_ptr + n, tl.sum(w.to(tl.float32) * x[None, :], axis=1))
    _mark(t_ptr, pid * 3 + 2, TRACE)


@triton.jit
def joined_kernel(x_ptr, w_ptr, vec_ptr, out_ptr, count_ptr, steps, target, BUSY: tl.constexpr, K: tl.constexpr,
                  BLOCK_N: tl.constexpr, NAP: tl.constexpr = False):  # fmt: skip
    """Both in one kernel: programs below ``BUSY`` run the busy chain and count themselves done;
    the others load their rows at once, spin until every busy program has counted, then finish
    the product (the overlap by hand, with no kernel boundary)."""
    pid = tl.program_id(0)
    if pid < BUSY:
        v = tl.load(x_ptr + pid * 32 + tl.arange(0, 32))
        for _ in range(steps):
            v = v * 0.999 + 0.001
        tl.store(x_ptr + pid * 32 + tl.arange(0, 32), v)
        tl.atomic_add(count_ptr, 1, sem="release")
    else:
        n = (pid - BUSY) * BLOCK_N + tl.arange(0, BLOCK_N)
        k = tl.arange(0, K)
        w = tl.load(w_ptr + n[:, None] * K + k[None, :])
        seen = tl.atomic_add(count_ptr, 0, sem="acquire")
        while seen < target:
            if NAP:
                seen = _nap(seen)
            seen = tl.atomic_add(count_ptr, 0, sem="acquire")
        x = tl.load(vec_ptr + k)
        tl.store(out_ptr + n, tl.sum(w.to(tl.float32) * x[None, :], axis=1))


def timeline(busy: torch.Tensor, read: torch.Tensor) -> None:
    """When the programs of the middle pairs started, got past their wait and ended, in µs from
    the first busy program's start of the pair (min / median / max over programs)."""
    busy, read = busy.cpu().double(), read.cpu().double()
    for layer in range(busy.shape[0] // 2, busy.shape[0] // 2 + 3):
        zero = busy[layer, :, 0].min()
        for name, t in (("busy", busy[layer]), ("read", read[layer])):
            spans = []
            for column, label in enumerate(("start", "past wait", "end")):
                q = (t[:, column] - zero) / 1000
                spans.append(f"{label} {q.min():7.2f} {q.median():7.2f} {q.max():7.2f}")
            print(f"  pair {layer} {name}: " + " | ".join(spans))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--steps", default="1000,4000", help="busy chain lengths to try")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--timeline", type=int, default=0, help="busy steps: print when each kernel's programs ran"
    )
    args = parser.parse_args()
    n, k = 2048, 4096
    weights = [torch.randn(n, k, device="cuda").to(torch.bfloat16) for _ in range(args.layers)]
    x = torch.rand(128 * 32, device="cuda")
    vector = torch.rand(k, device="cuda")
    out = torch.empty(n, device="cuda")
    print(torch.cuda.get_device_name(0), f"{args.layers} pairs, read {n}x{k} bf16 a pair")
    busy_times = torch.zeros(args.layers, 128, 3, dtype=torch.int64, device="cuda")
    read_times = torch.zeros(args.layers, n // 4, 3, dtype=torch.int64, device="cuda")

    def chain(
        steps: int, busy: bool = True, read: bool = True, pdl: bool = False, early: bool = True,
        late_trigger: bool = False, block_n: int = 8, warps: int = 8, trace: bool = False,
    ) -> None:  # fmt: skip
        extra = {"launch_pdl": True} if pdl else {}
        for layer, w in enumerate(weights):
            if busy:
                busy_kernel[(128,)](
                    x, steps, busy_times[layer], PDL=pdl, TRIGGER_LATE=late_trigger, TRACE=trace,
                    num_warps=4, **extra,
                )  # fmt: skip
            if read:
                read_kernel[(n // block_n,)](
                    w, vector, out, read_times[layer], K=k, BLOCK_N=block_n, PDL=pdl, EARLY=early, TRIGGER_LATE=late_trigger, TRACE=trace,
                    num_warps=warps, **extra,
                )  # fmt: skip

    def per_pair(fn) -> float:  # type: ignore[no-untyped-def]
        return 1000 * time_graph(fn, args.repeats) / args.layers

    count = torch.zeros(1, dtype=torch.int32, device="cuda")

    def joined(steps: int, nap: bool) -> None:
        count.zero_()
        for layer, w in enumerate(weights):
            joined_kernel[(128 + n // 8,)](
                x, w, vector, out, count, steps, 128 * (layer + 1), BUSY=128, K=k, BLOCK_N=8, NAP=nap, num_warps=8
            )  # fmt: skip

    if args.timeline:
        for name, kw in (
            ("plain", {}), ("PDL early loads", {"pdl": True}),
            ("PDL early loads, both trigger at exit", {"pdl": True, "late_trigger": True}),
        ):  # fmt: skip
            time_graph(lambda kw=kw: chain(args.timeline, trace=True, **kw), 3)
            print(f"timeline, {name}, busy {args.timeline} steps:")
            timeline(busy_times, read_times[:, : n // 8])
        return 0
    vec = vector.to(torch.bfloat16)[None]
    cublas = per_pair(lambda: [torch.nn.functional.linear(vec, w) for w in weights])
    print(f"read, cuBLAS (F.linear of one row): {cublas:6.2f} us")
    for block_n, warps in ((4, 4), (8, 4), (8, 8), (16, 8), (32, 8), (16, 16)):
        alone = per_pair(lambda b=block_n, nw=warps: chain(0, busy=False, block_n=b, warps=nw))
        print(f"read, {block_n:2} rows a program, {warps:2} warps: {alone:6.2f} us")
    read_alone = per_pair(lambda: chain(0, busy=False))
    for steps in (int(s) for s in args.steps.split(",")):
        busy = per_pair(lambda s=steps: chain(s, read=False))
        busy_pdl = per_pair(lambda s=steps: chain(s, read=False, pdl=True))
        plain = per_pair(lambda s=steps: chain(s))
        late = per_pair(lambda s=steps: chain(s, pdl=True, early=False))
        early = per_pair(lambda s=steps: chain(s, pdl=True))
        late_trigger = per_pair(lambda s=steps: chain(s, pdl=True, late_trigger=True))
        spin = per_pair(lambda s=steps: joined(s, nap=False))
        nap = per_pair(lambda s=steps: joined(s, nap=True))
        print(
            f"busy {steps:5} steps: alone {busy:6.2f} us (PDL chain {busy_pdl:6.2f}) | pair: plain {plain:6.2f}, "
            f"PDL late loads {late:6.2f}, PDL early loads {early:6.2f}, PDL early loads, both trigger at exit "
            f"{late_trigger:6.2f}, one kernel spinning {spin:6.2f}, napping {nap:6.2f} "
            f"(longer of the two {max(busy, read_alone):6.2f}, sum {busy + read_alone:6.2f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
