"""GPU memory rows from the caching allocator's stats, and how /metrics shows them."""

from __future__ import annotations

import re

import pytest
import torch

from omni_runtime.api.metrics import ApiMetrics
from omni_runtime.contract.engine import EngineStats, GpuMemory
from omni_runtime.executor.gpu_memory import from_stats, gpu_memory
from omni_runtime.models.qwen2_5_omni.placement import choose_attention_kernels

STATS = {
    "allocated_bytes.all.current": 7_000,
    "reserved_bytes.all.current": 9_000,
    "num_alloc_retries": 2,
    "num_ooms": 0,
}


@pytest.mark.parametrize(
    ("stats", "row"),
    [
        ({}, None),  # a GPU this process never allocated on
        ({"reserved_bytes.all.current": 0, "num_alloc_retries": 0, "num_ooms": 0}, None),
        (STATS, GpuMemory(gpu=3, allocated_bytes=7_000, reserved_bytes=9_000, alloc_retries=2, ooms=0)),
        # everything handed back after an OOM: still a row, the counters are what matter
        ({"num_ooms": 1}, GpuMemory(gpu=3, ooms=1)),
        ({"num_alloc_retries": 4}, GpuMemory(gpu=3, alloc_retries=4)),
    ],
)
def test_rows_from_allocator_stats(stats: dict[str, int], row: GpuMemory | None) -> None:
    assert from_stats(3, stats) == row


def test_no_rows_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the CUDA rows are covered by the GPU tests")
    assert gpu_memory() == ()


def test_metrics_show_each_gpu() -> None:
    """The worker's own GPUs with an empty process label, a stage process's with the stages it hosts
    (both number their GPUs from 0)."""
    gpus = (
        GpuMemory(0, 1_000, 2_000, 0, 0),
        GpuMemory(1, 5_000, 8_000, 3, 1),
        GpuMemory(0, 7_000, 9_000, 0, 0, process="thinker"),
    )
    text = ApiMetrics(stats=lambda: EngineStats(gpus=gpus), in_flight=lambda: 0).render().decode()
    lines = {line for line in text.splitlines() if re.match(r"omni_gpu_\w+\{", line)}
    assert lines == {
        'omni_gpu_memory_allocated_bytes{gpu="0",process=""} 1000.0',
        'omni_gpu_memory_allocated_bytes{gpu="1",process=""} 5000.0',
        'omni_gpu_memory_allocated_bytes{gpu="0",process="thinker"} 7000.0',
        'omni_gpu_memory_reserved_bytes{gpu="0",process=""} 2000.0',
        'omni_gpu_memory_reserved_bytes{gpu="1",process=""} 8000.0',
        'omni_gpu_memory_reserved_bytes{gpu="0",process="thinker"} 9000.0',
        'omni_gpu_alloc_retries_total{gpu="0",process=""} 0.0',
        'omni_gpu_alloc_retries_total{gpu="1",process=""} 3.0',
        'omni_gpu_alloc_retries_total{gpu="0",process="thinker"} 0.0',
        'omni_gpu_ooms_total{gpu="0",process=""} 0.0',
        'omni_gpu_ooms_total{gpu="1",process=""} 1.0',
        'omni_gpu_ooms_total{gpu="0",process="thinker"} 0.0',
    }


def test_cudnn_attention_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        monkeypatch.delenv("OMNI_CUDNN_ATTENTION", raising=False)
        assert choose_attention_kernels() is False and not torch.backends.cuda.cudnn_sdp_enabled()
        monkeypatch.setenv("OMNI_CUDNN_ATTENTION", "1")
        assert choose_attention_kernels() is True and torch.backends.cuda.cudnn_sdp_enabled()
        assert choose_attention_kernels(keep_cudnn=False) is False
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
