"""Host values to the device without waiting for the device.

``torch.tensor(values, device="cuda")`` and ``cpu_tensor.to("cuda")`` copy from pageable memory,
which makes the calling thread wait until its stream has run everything queued before the copy.
An admission that does that a few times per row (index lists, rope positions, media masks) turns
a batch of 32 prompts into a hundred round trips, each with the GPU idle while the thread queues
the next kernels. Through pinned memory the copy is queued like a kernel instead; PyTorch's
pinned-memory allocator keeps the staging buffer until the copy has run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def to_device(
    values: Sequence[Any] | torch.Tensor, device: torch.device, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``values`` (a list, or a tensor on any device) as a tensor on ``device``: a CUDA copy from
    the host is queued on the current stream (no host wait); anything else is a plain copy."""
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if dtype is not None and host.dtype != dtype:
        host = host.to(dtype)
    if device.type != "cuda" or host.device.type != "cpu":
        return host.to(device)
    # pin_memory refuses a view whose elements share memory (an expanded row of positions), and
    # would pin a whole base tensor for a slice of it: stage a compact copy.
    return host.contiguous().pin_memory().to(device, non_blocking=True)
