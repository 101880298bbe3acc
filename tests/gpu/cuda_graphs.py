"""What the hand-run GPU tools share (boundary_cost.py, layer_phases.py, l2_prefetch.py,
sweep_moe_layer.py): CUDA graph capture and the report file."""

from __future__ import annotations

from collections.abc import Callable

import torch


def capture(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """``fn`` run once on a side stream (its kernels compiled, its allocations made), then captured."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def write_report(path: str | None, lines: list[str]) -> None:
    """``lines`` to ``path`` (``--out``), one a line; nothing without a path."""
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
