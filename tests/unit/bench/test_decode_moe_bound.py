"""The MoE decode bound: experts a batch routes to, and the bytes a step reads (exact tables)."""

from __future__ import annotations

import pytest

from omni_runtime.bench.decode_moe import expected_experts, moe_bytes


@pytest.mark.parametrize(
    ("experts", "top_k", "batch", "expected"),
    [
        (128, 8, 1, 8.0),  # one row reads exactly its top-k
        (128, 8, 8, 128 * (1 - (120 / 128) ** 8)),  # ~50.2
        (128, 8, 32, 128 * (1 - (120 / 128) ** 32)),  # ~113.7
        (4, 4, 3, 4.0),  # top-k = all experts: every expert, whatever the batch
        (128, 8, 0, 0.0),  # no rows read no experts
    ],
)
def test_expected_experts(experts: int, top_k: int, batch: int, expected: float) -> None:
    assert expected_experts(experts, top_k, batch) == pytest.approx(expected, rel=1e-12)


def test_step_bytes_grow_with_the_experts_routed_to() -> None:
    per_step = moe_bytes(1000, 10, layers=2, experts=128, top_k=8)
    assert per_step(1) == 1000 + 2 * 8 * 10
    assert per_step(1) < per_step(8) < per_step(32) < 1000 + 2 * 128 * 10
