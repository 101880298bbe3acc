"""A decode step's attention reads each key/value head once, compiled or not.

With grouped-query attention (the Qwen2.5-Omni-7B thinker: 28 query heads on 4 key/value heads;
its talker 12 on 2), a one-token query can attend as ``[batch, kv_heads, groups, dim]``: each
group's query heads become the query positions of their key/value head. transformers' SDPA path
does this packing, but not under ``torch.compile``, and the slot decoder compiles its decode
layers. There it fell back to ``repeat_kv``: every layer of every step copied the cache view once
per query head of a group before attending. On an H100 at 16 streams that copy, fused with the
rotary embedding into one kernel, took a third of the thinker's GPU time and a fifth of the
talker's (tests/gpu/gpu_timeline.py).

:func:`use_packed_decode` registers :func:`packed_decode_attention` with transformers' attention
interface and points a decoder stack's attention modules at it. A query of one token with a mask
shared by every head is packed; anything else (prefill, a per-head mask, a position bias) goes to
transformers' SDPA function unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

NAME = "omni_packed_sdpa"


def packed_decode_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query`` [b, heads, q, d], ``key``/``value``
    [b, kv_heads, kv, d]; returns [b, q, heads, d] (and no weights)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = int(getattr(module, "num_key_value_groups", 1))
    shared_mask = attention_mask is None or attention_mask.shape[1] == 1
    if query.shape[2] != 1 or groups == 1 or not shared_mask or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    batch, heads, _, dim = query.shape
    # Query heads h = k * groups + g attend with key/value head k (transformers' repeat_kv order).
    packed = query.reshape(batch, heads // groups, groups, dim)
    out = F.scaled_dot_product_attention(
        packed, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling
    )
    return out.reshape(batch, heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


def register() -> None:
    """Make ``NAME`` an attention implementation transformers knows (idempotent): the function,
    and SDPA's mask format for code that builds masks from a config naming it."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(NAME, packed_decode_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def use_packed_decode(layers: nn.Module) -> int:
    """Point every grouped-query attention module under ``layers`` that uses SDPA at
    :func:`packed_decode_attention`; returns how many configs changed (each module reads its
    implementation from its config at every forward)."""
    register()
    changed: set[int] = set()
    for module in layers.modules():
        config = getattr(module, "config", None)
        if getattr(module, "num_key_value_groups", 1) <= 1 or config is None:
            continue
        if getattr(config, "_attn_implementation", None) == "sdpa":
            config._attn_implementation = NAME
            changed.add(id(config))
    return len(changed)
