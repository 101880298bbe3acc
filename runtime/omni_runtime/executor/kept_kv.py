"""A slot's KV copied out of the slot cache between a session's turns, and copied back into a slot.

Slots are reused and compacted as soon as a row ends, so a conversation's KV cannot stay in its
slot; it is copied into one tensor of its own (``[layers, 2, kv_heads, n, head_dim]``) when the
turn ends and copied into whichever slot the next turn gets (pipeline/conversation_kv.py decides
how much of it that turn may use). Besides the KV an entry keeps what the prefix rule and the
talker need that token ids do not say:

- the input embedding rows at media placeholders (placeholder ids are the same for every audio
  or image; the embedding is the medium), compared bit for bit with the next prompt's rows;
- optionally the talker's per-position vectors (token embedding with media zeroed, plus the
  final-norm hidden state), so a speech turn hands the talker its whole prompt's vectors without
  recomputing the kept part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class SlotKVCache(Protocol):
    """What the copies need of slot_cache.SlotKVCache: per layer ``[slots, kv_heads, len, d]``."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]


@dataclass
class KeptKV:
    kv: torch.Tensor  # [layers, 2, kv_heads, n, head_dim]
    media_index: torch.Tensor  # [m] media placeholder positions (ascending, device)
    media_rows: torch.Tensor  # [m, H] their input embeddings
    vectors: torch.Tensor | None  # [n, H] talker vectors of every kept position

    @property
    def length(self) -> int:
        return int(self.kv.shape[3])

    @property
    def nbytes(self) -> int:
        tensors = [self.kv, self.media_index, self.media_rows]
        if self.vectors is not None:
            tensors.append(self.vectors)
        return sum(t.numel() * t.element_size() for t in tensors)


def copy_out(cache: SlotKVCache, *, slot: int, length: int) -> torch.Tensor:
    """The first ``length`` positions of ``slot``, as one new tensor ``[layers, 2, kv_heads, n, d]``."""
    first = cache.keys[0]
    shape = (len(cache.keys), 2, first.shape[1], length, first.shape[3])
    kv = torch.empty(shape, dtype=first.dtype, device=first.device)
    for layer, (keys, values) in enumerate(zip(cache.keys, cache.values, strict=True)):
        kv[layer, 0] = keys[slot, :, :length]
        kv[layer, 1] = values[slot, :, :length]
    return kv


def copy_in(cache: SlotKVCache, kv: torch.Tensor, *, slot: int, length: int) -> None:
    """Copy the first ``length`` positions of ``kv`` (from ``copy_out``) into ``slot``."""
    for layer, (keys, values) in enumerate(zip(cache.keys, cache.values, strict=True)):
        keys[slot, :, :length] = kv[layer, 0, :, :length]
        values[slot, :, :length] = kv[layer, 1, :, :length]


def media_agreement(kept: KeptKV, embeds: torch.Tensor, limit: int) -> int:
    """``limit``, or less: the first media position below it whose new input embedding
    (``embeds`` [L, H], the new prompt's) differs from the kept one in any bit."""
    inside = kept.media_index < limit
    index = kept.media_index[inside]
    if index.numel() == 0:
        return limit
    new_rows = embeds[index.to(embeds.device)].to(kept.media_rows.device, kept.media_rows.dtype)
    differs = (new_rows != kept.media_rows[: index.numel()]).any(dim=-1)
    if not bool(differs.any()):
        return limit
    return int(index[int(differs.nonzero()[0, 0])])


def suffix_groups(offsets: list[int], lengths: list[int], max_len: int) -> list[list[int]]:
    """Which suffix prefills run together: indices of rows whose kept prefixes (``offsets``) and
    whole prompts (``lengths``) fit one batch, in order. A batch is right-padded to its longest
    suffix and reads keys up to its longest prefix plus that width, which must stay within the
    slots' ``max_len``; a row that would take a batch past it starts the next one."""
    groups: list[list[int]] = []
    longest_prefix = widest = 0
    for i, (offset, length) in enumerate(zip(offsets, lengths, strict=True)):
        prefix, width = max(longest_prefix, offset), max(widest, length - offset)
        if groups and prefix + width <= max_len:
            groups[-1].append(i)
            longest_prefix, widest = prefix, width
        else:
            groups.append([i])
            longest_prefix, widest = offset, length - offset
    return groups
