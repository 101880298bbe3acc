"""The split-key decode attention kernels (executor.decode_attention) run by Triton's interpreter on
CPU tensors, against PyTorch's SDPA over repeated key/value heads. Collected only in a process
started with TRITON_INTERPRET=1: tests/unit/models/test_moe_decode.py starts one for this folder."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from omni_runtime.executor import decode_attention
from omni_runtime.executor.decode_attention import packed_decode_attention, split_key_attention, split_plan

assert os.environ.get("TRITON_INTERPRET") == "1", "run under TRITON_INTERPRET=1 (see the docstring)"


def reference(query, key, value, mask, scale):
    """[b, kv, g, d] packed queries against [b, kv, L, d] keys, float64, mask [b or 1, L]."""
    bias = None if mask is None else mask[:, None, None, :]
    return F.scaled_dot_product_attention(
        query.double(), key.double(), value.double(), attn_mask=bias, scale=scale
    ).float()


def ragged(rows: int, length: int, seed: int) -> torch.Tensor:
    """A decode mask: each row's keys up to its own length (at least one)."""
    lengths = torch.randint(1, length + 1, (rows,), generator=torch.Generator().manual_seed(seed))
    lengths[0] = length  # one row with every key
    return torch.arange(length)[None, :] < lengths[:, None]


@pytest.mark.parametrize(
    ("rows", "kv_heads", "groups", "dim", "length", "masking"),
    [
        (3, 2, 6, 64, 100, "ragged"),  # the talker's grouping; no multiple of the key block
        (1, 4, 7, 128, 256, "none"),  # the 7B thinker's heads, one row, many splits
        (2, 1, 1, 16, 5, "ragged"),  # one query head, fewer keys than a block
        (4, 2, 8, 32, 70, "broadcast"),  # one mask row for every row
    ],
)
def test_split_key_attention_equals_sdpa(rows, kv_heads, groups, dim, length, masking) -> None:
    g = torch.Generator().manual_seed(rows * 100 + dim)
    query = torch.randn(rows, kv_heads, groups, dim, generator=g)
    # Keys and values are views of a larger cache, as the slot decoder hands them over.
    cache = torch.randn(2, rows + 2, kv_heads, length + 30, dim, generator=g)
    key, value = cache[0, :rows, :, :length], cache[1, :rows, :, :length]
    mask = {"none": None, "ragged": ragged(rows, length, seed=dim), "broadcast": ragged(1, length, seed=3)}[
        masking
    ]
    got = split_key_attention(query, key, value, mask, 0.125)
    assert got.shape == query.shape
    torch.testing.assert_close(got, reference(query, key, value, mask, 0.125), rtol=1e-4, atol=1e-4)


def test_a_row_with_no_key_gives_zeros_not_nan() -> None:
    query = torch.randn(2, 1, 4, 16)
    key, value = torch.randn(2, 2, 1, 40, 16).unbind(0)
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1] = False
    got = split_key_attention(query, key, value, mask, 0.25)
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    torch.testing.assert_close(
        got[:1], reference(query[:1], key[:1], value[:1], mask[:1], 0.25), rtol=1e-4, atol=1e-4
    )


class Attention(nn.Module):
    num_key_value_groups = 6


def test_the_packed_decode_path_takes_the_kernel_and_matches_repeated_heads(monkeypatch) -> None:
    monkeypatch.setattr(decode_attention, "KERNEL", "split")  # opt-in (OMNI_DECODE_KERNEL=split)
    calls: list[int] = []
    original = decode_attention.split_key_attention
    monkeypatch.setattr(decode_attention, "split_key_attention", lambda *a: calls.append(1) or original(*a))
    g = torch.Generator().manual_seed(5)
    query = torch.randn(3, 12, 1, 64, generator=g)
    key, value = torch.randn(2, 3, 2, 90, 64, generator=g).unbind(0)
    mask = ragged(3, 90, seed=9)[:, None, None, :]
    got, _ = packed_decode_attention(Attention(), query, key, value, mask, scaling=0.1)
    assert calls == [1]
    repeated = F.scaled_dot_product_attention(
        query, key.repeat_interleave(6, dim=1), value.repeat_interleave(6, dim=1), attn_mask=mask, scale=0.1
    ).transpose(1, 2)
    torch.testing.assert_close(got, repeated, rtol=1e-4, atol=1e-4)


def test_split_plans_used_above_cover_their_keys() -> None:
    for rows, heads, length in [(3, 2, 100), (1, 4, 256), (2, 1, 5), (4, 2, 70)]:
        splits, per_split = split_plan(rows, heads, length)
        assert splits * per_split >= length > (splits - 1) * per_split
