"""Where the executor's Triton kernels run: on CUDA tensors, or on CPU tensors under Triton's
interpreter (``TRITON_INTERPRET=1``, which Triton reads when it is first imported), as the
kernels' CPU tests run them. Elsewhere a caller takes its PyTorch path."""

from __future__ import annotations

import importlib.util
import os

import torch


def triton_available() -> bool:
    """Whether Triton is installed (the CPU image leaves it out)."""
    return importlib.util.find_spec("triton") is not None


def interpreted() -> bool:
    """Whether Triton's interpreter runs the kernels (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_runs_on(tensor: torch.Tensor) -> bool:
    """Whether a Triton kernel can take ``tensor``: it is on a GPU, or the interpreter is on."""
    return tensor.is_cuda or interpreted()


def hopper_or_later(device: torch.device) -> bool:
    """Whether ``device`` is a GPU of compute capability 9.0 or later (programmatic dependent
    launch, ``launch_pdl``, needs it)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
