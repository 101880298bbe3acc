"""One GEMM for the Qwen3-Omni-MoE thinker's q, k and v projections.

At decode a layer's attention reads its q, k and v weights (16, 2 and 2 MB at the 30B-A3B shape)
with three GEMV launches; the k and v ones are too small to fill the GPU and took about 5 µs each
on an H200, a fifth of the layer's attention time. :func:`fuse_qkv` stores the three weights as
one ``qkv_weight`` (``q_proj``, ``k_proj`` and ``v_proj`` keep their weights as plain-tensor views
of it, so the memory and the parameter count are unchanged and code that reads them still finds
them) and swaps each
attention module's class for a subclass whose forward makes one projection and splits it. The
rest of the forward is transformers' own sequence: per-head q and k norms, rotary embedding, the
cache update, the configured attention function, the output projection. Done after the weights
are loaded and sharded; on CUDA only (loader), where the launches matter.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf


class FusedQKVAttention(hf.Qwen3OmniMoeThinkerTextAttention):
    """transformers' thinker attention with ``qkv_weight`` [Nq + 2 Nkv, H] (``fuse_qkv``)."""

    qkv_weight: nn.Parameter
    qkv_bias: nn.Parameter | None
    qkv_sizes: tuple[int, int, int]

    def forward(  # type: ignore[override]
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q, k, v = F.linear(hidden_states, self.qkv_weight, self.qkv_bias).split(self.qkv_sizes, dim=-1)
        query = self.q_norm(q.reshape(hidden_shape)).transpose(1, 2)
        key = self.k_norm(k.reshape(hidden_shape)).transpose(1, 2)
        value = v.reshape(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query, key = hf.apply_rotary_pos_emb(query, key, cos, sin)
        if past_key_values is not None:
            key, value = past_key_values.update(key, value, self.layer_idx)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, hf.eager_attention_forward
        )
        output, weights = attention(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=0.0,
            scaling=self.scaling,
            sliding_window=self.sliding_window,
            **kwargs,
        )
        return self.o_proj(output.reshape(*input_shape, -1).contiguous()), weights


def fuse_qkv(text_model: nn.Module, fused: bool = True) -> int:
    """Give every thinker attention module of ``text_model`` one q/k/v projection (or, with
    ``fused=False``, transformers' three again, reading the same weights); how many changed."""
    count = 0
    for module in text_model.modules():
        kind = type(module)
        if fused and kind is hf.Qwen3OmniMoeThinkerTextAttention:
            if not hasattr(module, "qkv_weight"):
                _fuse(module)
            module.__class__ = FusedQKVAttention
            count += 1
        elif not fused and kind is FusedQKVAttention:
            module.__class__ = hf.Qwen3OmniMoeThinkerTextAttention
            count += 1
    return count


def _fuse(attention: Any) -> None:
    projections = (attention.q_proj, attention.k_proj, attention.v_proj)
    with torch.no_grad():
        weight = torch.cat([p.weight for p in projections])
        bias = torch.cat([p.bias for p in projections]) if projections[0].bias is not None else None
    sizes = tuple(int(p.weight.shape[0]) for p in projections)
    attention.qkv_weight = nn.Parameter(weight, requires_grad=False)
    attention.qkv_bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
    attention.qkv_sizes = sizes
    start = 0
    for projection, size in zip(projections, sizes, strict=True):
        # Plain tensors, not parameters: the weights are counted (and read) once, as qkv_weight.
        for name, fused in (("weight", attention.qkv_weight), ("bias", attention.qkv_bias)):
            if fused is not None:
                del projection._parameters[name]
                setattr(projection, name, fused[start : start + size])
        start += size
