"""The DiT's block attention mask as one additive bias per call (models/qwen2_5_omni/vocoder.py)."""

from __future__ import annotations

import pytest
import torch

from omni_runtime.models.qwen2_5_omni.vocoder import BIAS_ALIGNMENT, block_bias


def _block_diff(frames: int, block: int) -> torch.Tensor:
    """transformers' ``_create_block_diff`` for one row and head: block(j) - block(i)."""
    blocks = torch.arange(frames) // block
    return blocks[None, :] - blocks[:, None]


@pytest.mark.parametrize(
    ("frames", "block", "back", "ahead", "allowed"),
    [
        # 4 frames in blocks of 2: each frame sees its own block only
        (4, 2, 0, 0, [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]]),
        # ... and the block before it
        (4, 2, 1, 0, [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]),
        # ... and the block after it
        (4, 2, 0, 1, [[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1], [0, 0, 1, 1]]),
        # 3 frames in blocks of 1, one back and one ahead: a band
        (3, 1, 1, 1, [[1, 1, 0], [1, 1, 1], [0, 1, 1]]),
    ],
)
def test_block_bias_is_zero_where_the_mask_allows(
    frames: int, block: int, back: int, ahead: int, allowed: list[list[int]]
) -> None:
    bias = block_bias(_block_diff(frames, block), back, ahead, torch.float32)
    expected = torch.where(torch.tensor(allowed, dtype=torch.bool), 0.0, float("-inf"))
    assert torch.equal(bias, expected)


@pytest.mark.parametrize("frames", [15, 16, 17, 55, 120])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_bias_rows_start_aligned_and_attend_as_the_boolean_mask(
    frames: int, dtype: torch.dtype
) -> None:
    diff = _block_diff(frames, 24)
    bias = block_bias(diff, 1, 0, dtype)
    assert bias.dtype == dtype and bias.shape == (frames, frames)
    assert bias.stride(0) % BIAS_ALIGNMENT == 0 and bias.stride(1) == 1
    # broadcast over rows and heads as the vocoder passes it: the same attention as the boolean mask
    rows, heads, dim = 2, 3, 8
    q, k, v = (torch.randn(rows, heads, frames, dim, dtype=dtype) for _ in range(3))
    mask = ((diff >= -1) & (diff <= 0)).expand(rows, heads, frames, frames)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=bias.expand(rows, heads, frames, frames)
    )
    torch.testing.assert_close(got, want)
