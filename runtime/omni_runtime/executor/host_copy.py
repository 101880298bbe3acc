"""Host values to the device without waiting for the device, and device values to the host
read later.

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


class HostLater:
    """A device tensor's values, copied to the host behind the work queued so far, read later.

    On CUDA the copy goes to pinned memory on the current stream with an event after it, so the
    caller can queue more work (the next decode step) before it waits for these values; ``get``
    waits for the event only. Elsewhere the values are read at once (there is nothing to overlap).
    """

    def __init__(self, values: torch.Tensor) -> None:
        self._event: torch.cuda.Event | None = None
        if values.device.type == "cuda":
            self._host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self._host.copy_(values, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = values.to("cpu", copy=True)

    def get(self) -> list[Any]:
        """The values as a list, once the copy has run."""
        if self._event is not None:
            self._event.synchronize()
        return self._host.tolist()  # type: ignore[no-any-return]
