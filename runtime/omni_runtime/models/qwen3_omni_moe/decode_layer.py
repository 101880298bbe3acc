"""The Qwen3-Omni-MoE thinker's decode layers as fused kernels (executor.moe_layer).

:func:`fused_decode_layers` reads each thinker decoder layer's weights into
``MoeLayerWeights`` and wraps the slot decoder's step callable, which stays the fallback for
what the fused step does not take (prefill, more than ``MAX_ROWS`` rows). It needs the fused
q/k/v projection (attention.fuse_qkv, done on CUDA at load) and a MoE block in every layer; a
stack that differs (a dense layer, biases, a tensor-parallel shard) keeps the layers it has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf

from omni_runtime.contract import switches
from omni_runtime.executor import moe_decode, moe_step
from omni_runtime.executor.moe_layer import FusedMoeDecodeLayer, MoeLayerWeights
from omni_runtime.models.qwen3_omni_moe.attention import FusedQKVAttention

MODES = switches.BY_NAME["OMNI_MOE_LAYER"].choices  # pdl, fused, off


def layer_weights(layer: nn.Module) -> MoeLayerWeights | None:
    """One thinker decoder layer's weights for the fused step, or None where it cannot take it."""
    attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if not isinstance(attention, FusedQKVAttention) or not isinstance(
        mlp, hf.Qwen3OmniMoeThinkerTextSparseMoeBlock
    ):
        return None
    if attention.qkv_bias is not None or attention.o_proj.bias is not None:
        return None
    if not moe_decode.fusable_experts(mlp.experts) or not moe_decode.is_router(mlp.gate):
        return None
    q_size, k_size, _ = attention.qkv_sizes
    head_dim = int(attention.head_dim)
    weights = MoeLayerWeights(
        input_norm=layer.input_layernorm.weight,
        qkv=attention.qkv_weight,
        q_norm=attention.q_norm.weight,
        k_norm=attention.k_norm.weight,
        o_proj=attention.o_proj.weight,
        post_norm=layer.post_attention_layernorm.weight,
        router=mlp.gate.weight,
        gate_up=mlp.experts.gate_up_proj,
        down=mlp.experts.down_proj,
        heads=q_size // head_dim,
        kv_heads=k_size // head_dim,
        head_dim=head_dim,
        top_k=int(mlp.gate.top_k),
        normalize=bool(mlp.gate.norm_topk_prob),
        eps=float(layer.input_layernorm.variance_epsilon),
        qk_eps=float(attention.q_norm.variance_epsilon),
        scaling=float(attention.scaling),
    )
    if layer.post_attention_layernorm.variance_epsilon != weights.eps:
        return None
    if attention.k_norm.variance_epsilon != weights.qk_eps:
        return None
    try:
        weights.check()
    except ValueError:
        return None
    return weights


def fused_decode_layers(
    layers: nn.ModuleList, step_layers: list[Callable[..., Any]], mode: str
) -> list[Callable[..., Any]] | None:
    """The decode callables of ``layers`` (``mode`` fused or pdl), each falling back to its step
    layer; None where ``mode`` is off or some layer cannot take the fused step."""
    if mode not in MODES:
        raise ValueError(f"OMNI_MOE_LAYER is {mode!r}; use one of {', '.join(MODES)}")
    if mode == "off":
        return None
    fused: list[Callable[..., Any]] = []
    for layer, step in zip(layers, step_layers, strict=True):
        weights = layer_weights(layer)
        if weights is None:
            return None
        fused.append(FusedMoeDecodeLayer(weights, step, pdl=mode == "pdl"))
    return fused


def fused_decode_stack(fused: list[Callable[..., Any]], *, pdl: bool) -> moe_step.RowStep | None:
    """Every fused layer of a one-row decode step in one kernel (executor.moe_step), or None where
    it does not run here (then the fused layers run one by one)."""
    weights = [layer.weights for layer in fused if isinstance(layer, FusedMoeDecodeLayer)]
    if len(weights) != len(fused):
        return None
    return moe_step.row_step(weights, pdl=pdl)
