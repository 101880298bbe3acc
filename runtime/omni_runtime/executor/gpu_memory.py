"""What each GPU's caching allocator holds and how often it had to give everything back.

An allocation the caching allocator cannot serve from its free blocks or a fresh ``cudaMalloc``
makes it free every cached block (a wait for the whole device) and try again; the allocations
after that pay ``cudaMalloc`` again. Under load that is a stall of every stream on the GPU with
nothing in the logs, so the worker reports the count in /metrics (``omni_gpu_alloc_retries``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from omni_runtime.contract.engine import GpuMemory


def from_stats(gpu: int, stats: Mapping[str, Any]) -> GpuMemory | None:
    """One GPU's row from ``torch.cuda.memory_stats`` (None: this process never allocated there)."""
    reserved = int(stats.get("reserved_bytes.all.current", 0))
    retries = int(stats.get("num_alloc_retries", 0))
    ooms = int(stats.get("num_ooms", 0))
    if not (reserved or retries or ooms):
        return None
    return GpuMemory(
        gpu=gpu,
        allocated_bytes=int(stats.get("allocated_bytes.all.current", 0)),
        reserved_bytes=reserved,
        alloc_retries=retries,
        ooms=ooms,
    )


def gpu_memory() -> tuple[GpuMemory, ...]:
    """Every GPU this process allocated on; nothing when it runs without CUDA."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return ()
    rows = (from_stats(index, torch.cuda.memory_stats(index)) for index in range(torch.cuda.device_count()))
    return tuple(row for row in rows if row is not None)
