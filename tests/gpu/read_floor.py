"""What reading N megabytes costs in one kernel on this GPU, at the sizes a decode layer reads
(run by hand on the device machine; issue 17's bound divides bytes by the bandwidth of a 4 GiB
copy). For each size: 48 distinct buffers (more than L2 holds together), one read kernel each,
captured in one CUDA graph; µs a read and the bandwidth it reached, for a Triton streaming read
(one sum per program) and torch's row sum.

    python tests/gpu/read_floor.py --sizes 4,17,21,25,50,75,113 --out /tmp/read-floor.txt
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from cuda_graphs import capture  # tests/gpu, beside this script


@triton.jit
def _read(x_ptr, out_ptr, n, BLOCK: tl.constexpr, PER: tl.constexpr):
    """Program p sums ``PER`` blocks of ``BLOCK`` elements, all loads issued before the sum."""
    start = tl.program_id(0) * BLOCK * PER
    acc = tl.zeros([BLOCK], tl.float32)
    for i in tl.static_range(PER):
        at = start + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + at, mask=at < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))


def _timed(fn, buffers: list[torch.Tensor], reps: int = 5) -> float:
    """µs a read: ``fn`` over every buffer, captured once, replayed ``reps`` times (the mean)."""
    graph = capture(lambda: [fn(b) for b in buffers])
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / reps / len(buffers)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="4,17,21,25,50,75,113", help="megabytes a read")
    parser.add_argument("--count", type=int, default=48, help="buffers of each size")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    lines = [f"{torch.cuda.get_device_name()}: µs a read (TB/s), {args.count} buffers a size, one CUDA graph"]
    for mb in (float(s) for s in args.sizes.split(",")):
        n = int(mb * 1e6) // 2 // 1024 * 1024  # whole rows of 1024 for the row sum
        buffers = [torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(args.count)]
        row = [f"{mb:6.1f} MB"]
        for name, block, per in (
            ("triton 4x1024", 1024, 4),
            ("triton 8x2048", 2048, 8),
            ("triton 2x4096", 4096, 2),
        ):
            grid = triton.cdiv(n, block * per)
            out = torch.empty(grid, device="cuda", dtype=torch.float32)
            us = _timed(
                lambda b, out=out, grid=grid, block=block, per=per, n=n: _read[(grid,)](
                    b, out, n, BLOCK=block, PER=per
                ),
                buffers,
            )
            row.append(f"{name} {us:7.2f} ({n * 2 / us / 1e6:.2f})")
        us = _timed(lambda b: b.view(-1, 1024).sum(dim=1), buffers)
        row.append(f"torch row sum {us:7.2f} ({n * 2 / us / 1e6:.2f})")
        lines.append("  ".join(row))
        print(lines[-1], flush=True)
        del buffers
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
