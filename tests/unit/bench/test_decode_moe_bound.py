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


def test_decode_plot_is_a_png_for_the_committed_h200_results(tmp_path) -> None:
    """bench.decode writes a plot beside its JSON; the committed H200 results draw (each build,
    HF generate and the bound), as do results without per-build rows or generate."""
    import json
    from pathlib import Path

    from omni_runtime.bench.report import plot_decode

    results = json.loads((Path(__file__).parents[3] / "docs/bench/decode-qwen3-h200.json").read_text())
    assert set(results["rows"][0]["runtime_ms_per_step_by_experts_kernel"]) == {
        "omni_fused+qkv",
        "omni_fused",
        "grouped_mm",
    }
    plot_decode(tmp_path / "decode.png", results)
    bare = {
        **results,
        "rows": [
            {**row, "runtime_ms_per_step_by_experts_kernel": None, "generate_ms_per_step": None}
            for row in results["rows"]
        ],
    }
    plot_decode(tmp_path / "bare.png", bare)
    for name in ("decode.png", "bare.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
