"""Suffix prefills after kept conversation prefixes, several rows at once: which rows share a
batch, and what each row's attention may see (exact tables)."""

from __future__ import annotations

import pytest
import torch

from omni_runtime.executor.kept_kv import suffix_groups
from omni_runtime.executor.slot_cache import suffix_mask


@pytest.mark.parametrize(
    ("offsets", "lengths", "max_len", "groups"),
    [
        ([100], [130], 512, [[0]]),
        ([100, 40, 250], [130, 200, 300], 512, [[0, 1, 2]]),  # prefix 250 + width 160 fits
        # the third row's prefix (450) plus the batch's width (160) would pass 512: a new batch
        ([100, 40, 450], [130, 200, 470], 512, [[0, 1], [2]]),
        # a wide suffix after a long prefix: each on its own
        ([400, 10], [500, 400], 512, [[0], [1]]),
        # fits exactly at max_len
        ([256, 0 + 1], [300, 257], 512, [[0, 1]]),
    ],
)
def test_suffix_groups(offsets: list[int], lengths: list[int], max_len: int, groups: list[list[int]]) -> None:
    assert suffix_groups(offsets, lengths, max_len) == groups


def test_each_row_sees_its_own_prefix_and_its_suffix_up_to_itself() -> None:
    mask = suffix_mask([2, 0, 3], 2)  # rows kept 2, 0 and 3 positions; a suffix of width 2
    assert mask.shape == (3, 1, 2, 5)
    visible = [[[int(v) for v in query] for query in row[0]] for row in mask]
    assert visible == [
        [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]],  # positions 2 and 3 see keys 0..2 and 0..3
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0]],  # no prefix: plain causal
        [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]],
    ]
    assert mask.dtype == torch.bool
