"""executor.host_copy: host values to a device (the CPU path here; the queued CUDA copy is checked
with the talker's admission in tests/gpu/test_qwen3_talker_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from omni_runtime.executor.host_copy import to_device

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("values", "dtype", "expected"),
    [
        ([3, 1, 2], torch.long, torch.tensor([3, 1, 2], dtype=torch.long)),
        ([True, False, True], torch.bool, torch.tensor([True, False, True])),
        ([], torch.long, torch.zeros(0, dtype=torch.long)),
        (torch.tensor([1.5, 2.5]), torch.bfloat16, torch.tensor([1.5, 2.5], dtype=torch.bfloat16)),
        (torch.tensor([[0, 1], [2, 3]]), None, torch.tensor([[0, 1], [2, 3]])),
        # an expanded row (elements sharing memory), as a prompt's rope positions can be
        (torch.arange(3).expand(2, 3), None, torch.tensor([[0, 1, 2], [0, 1, 2]])),
    ],
)
def test_values_arrive_with_their_dtype(values, dtype, expected) -> None:
    out = to_device(values, CPU, dtype)
    assert out.dtype == expected.dtype and out.device == CPU
    assert torch.equal(out, expected)
