"""The Qwen3-Omni-MoE thinker's fused q/k/v projection (models/qwen3_omni_moe/attention.py) gives
transformers' own text model output, keeps the weights' memory and parameter count, and leaves
q_proj/k_proj/v_proj readable."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3OmniMoeConfig
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf

from omni_runtime.models.qwen3_omni_moe.attention import FusedQKVAttention, fuse_qkv


def tiny_text_model(bias: bool) -> torch.nn.Module:
    text = Qwen3OmniMoeConfig().thinker_config.text_config
    text.hidden_size, text.num_hidden_layers, text.num_attention_heads = 64, 2, 4
    text.num_key_value_heads, text.head_dim, text.vocab_size = 2, 16, 128
    text.num_experts, text.moe_intermediate_size, text.num_experts_per_tok = 4, 32, 2
    text.attention_bias = bias
    torch.manual_seed(0)
    model = hf.Qwen3OmniMoeThinkerTextModel(text).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(std=0.1)
    return model


@pytest.mark.parametrize("bias", [False, True], ids=["released (no bias)", "with bias"])
def test_fused_text_model_equals_transformers(bias: bool) -> None:
    model = tiny_text_model(bias)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    params_before = sum(p.numel() for p in model.parameters())
    q_before = model.layers[1].self_attn.q_proj.weight.clone()
    with torch.no_grad():
        want = model(input_ids=ids).last_hidden_state
        assert fuse_qkv(model) == 2
        got = model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert sum(p.numel() for p in model.parameters()) == params_before
    attn = model.layers[1].self_attn
    assert type(attn) is FusedQKVAttention and attn.qkv_sizes == (64, 32, 32)
    assert torch.equal(attn.q_proj.weight, q_before)
    assert attn.q_proj.weight.data_ptr() == attn.qkv_weight.data_ptr()  # a view, not a copy
    assert fuse_qkv(model) == 0  # already fused


def test_unfusing_gives_transformers_attention_on_the_same_weights() -> None:
    model = tiny_text_model(False)
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        fuse_qkv(model)
        fused = model(input_ids=ids).last_hidden_state
        assert fuse_qkv(model, fused=False) == 2
        assert type(model.layers[0].self_attn) is hf.Qwen3OmniMoeThinkerTextAttention
        separate = model(input_ids=ids).last_hidden_state
        assert fuse_qkv(model) == 2 and type(model.layers[0].self_attn) is FusedQKVAttention
    torch.testing.assert_close(separate, fused, rtol=1e-5, atol=1e-5)
