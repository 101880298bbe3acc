"""The Qwen3-Omni-MoE configs: the released 30B-A3B shape and the tiny one build with transformers'
own classes (the 5.23 talker fields filled in), and the released one has the published shapes.

Modules are built on the meta device: shapes and parameter counts without allocating 30B weights.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf

from omni_runtime.models.qwen3_omni_moe.config import (
    build_config,
    ensure_talker_fields,
    released_30b_a3b_config,
    tiny_config_dict,
)
from omni_runtime.models.qwen3_omni_moe.tiny_processor import VOCAB_SIZE, special_token_ids


def _meta(cls, config):
    with torch.device("meta"):
        return cls._from_config(config)


def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.fixture(scope="module")
def released():
    return released_30b_a3b_config()


def test_released_thinker_has_the_published_shape(released) -> None:
    text = released.thinker_config.text_config
    assert (text.num_hidden_layers, text.hidden_size, text.vocab_size) == (48, 2048, 152064)
    assert (text.num_attention_heads, text.num_key_value_heads, text.head_dim) == (32, 4, 128)
    assert (text.num_experts, text.num_experts_per_tok, text.moe_intermediate_size) == (128, 8, 768)
    model = _meta(hf.Qwen3OmniMoeThinkerTextModel, text)
    layer = model.layers[0]
    assert isinstance(layer.mlp, hf.Qwen3OmniMoeThinkerTextSparseMoeBlock)
    assert tuple(layer.mlp.experts.gate_up_proj.shape) == (128, 2 * 768, 2048)
    assert tuple(layer.mlp.experts.down_proj.shape) == (128, 2048, 768)
    assert tuple(layer.self_attn.q_proj.weight.shape) == (32 * 128, 2048)
    assert tuple(model.embed_tokens.weight.shape) == (152064, 2048)
    # 30B total: the text model plus its untied LM head (152064 x 2048).
    total = _params(model) + 152064 * 2048
    assert round(total / 1e9, 1) == 30.5
    # A3B: with 8 of 128 experts per layer, about 3B parameters take part in a token's step.
    expert = 3 * 2048 * 768
    active = total - 48 * (128 - 8) * expert
    assert 3.0e9 < active < 3.5e9


def test_released_encoders_and_speech_modules(released) -> None:
    thinker = released.thinker_config
    assert (
        thinker.audio_config.encoder_layers,
        thinker.audio_config.d_model,
        thinker.audio_config.output_dim,
    ) == (
        32,
        1280,
        2048,
    )
    vision = thinker.vision_config
    assert (vision.depth, vision.hidden_size, vision.patch_size, vision.out_hidden_size) == (
        27,
        1152,
        16,
        2048,
    )
    assert list(vision.deepstack_visual_indexes) == [8, 16, 24]
    talker = released.talker_config
    assert (talker.num_code_groups, talker.thinker_hidden_size, talker.accept_hidden_layer) == (16, 2048, 24)
    assert (talker.codec_pad_id, talker.codec_bos_id, talker.codec_eos_token_id) == (2148, 2149, 2150)
    text = talker.text_config
    assert (text.num_hidden_layers, text.hidden_size, text.vocab_size) == (20, 1024, 3072)
    assert (text.num_experts, text.num_experts_per_tok, text.moe_intermediate_size) == (128, 6, 384)
    built = _meta(hf.Qwen3OmniMoeTalkerForConditionalGeneration, talker)  # fails in 5.23 without the fix
    moe = built.model.layers[0].mlp
    assert tuple(moe.shared_expert.gate_proj.weight.shape) == (768, 1024)
    assert len(built.code_predictor.model.layers) == 5
    code2wav = released.code2wav_config
    assert (code2wav.num_quantizers, code2wav.codebook_size, code2wav.decoder_dim) == (16, 2048, 1536)
    # 1920 samples per 12.5 Hz frame: 24 kHz output.
    upsample = 1
    for factor in (*code2wav.upsample_rates, *code2wav.upsampling_ratios):
        upsample *= factor
    assert upsample * 12.5 == 24000


def test_transformers_default_is_not_the_released_shape(released) -> None:
    from transformers import Qwen3OmniMoeConfig

    default = Qwen3OmniMoeConfig().thinker_config.text_config
    assert (default.num_hidden_layers, default.vocab_size) == (28, 3584)
    assert released.thinker_config.text_config.num_hidden_layers != default.num_hidden_layers


def test_released_config_round_trips_through_json(released, tmp_path) -> None:
    from transformers import AutoConfig

    released.save_pretrained(tmp_path)
    loaded = ensure_talker_fields(AutoConfig.from_pretrained(tmp_path))
    assert loaded.model_type == "qwen3_omni_moe"
    assert loaded.talker_config.text_config.shared_expert_intermediate_size == 768
    assert loaded.thinker_config.text_config.to_dict() == released.thinker_config.text_config.to_dict()


def test_ensure_talker_fields_fills_what_5_23_lacks() -> None:
    from transformers import Qwen3OmniMoeConfig

    config = ensure_talker_fields(Qwen3OmniMoeConfig())
    assert config.talker_config.text_config.shared_expert_intermediate_size == 768
    assert config.talker_config.spatial_merge_size == 2


def test_tiny_config_has_the_released_layout() -> None:
    ids = {**special_token_ids(), "system": 1, "user": 2, "assistant": 3}
    config = build_config(tiny_config_dict(ids, vocab_size=VOCAB_SIZE, thinker_hidden=128))
    text = config.thinker_config.text_config
    assert (text.num_hidden_layers, text.vocab_size, text.num_experts, text.num_experts_per_tok) == (
        2,
        4096,
        8,
        2,
    )
    assert config.thinker_config.audio_token_id == ids["<|audio_pad|>"]
    assert config.talker_config.num_code_groups == config.code2wav_config.num_quantizers
    model = _meta(hf.Qwen3OmniMoeForConditionalGeneration, config)
    assert isinstance(
        model.thinker.model.language_model.layers[1].mlp, hf.Qwen3OmniMoeThinkerTextSparseMoeBlock
    )
    assert model.talker.model.layers[0].mlp.shared_expert is not None
    assert _params(model) < 20_000_000


@pytest.mark.parametrize(
    ("value", "chosen"),
    [
        (None, "omni_fused"),  # the default where Triton is installed (it is in the test venv)
        ("", "omni_fused"),
        ("grouped_mm", "grouped_mm"),
        ("batched_mm", "batched_mm"),
        (" eager ", "eager"),
        ("omni_fused", "omni_fused"),  # registered in transformers' ExpertsInterface on the way
    ],
)
def test_experts_implementation_from_the_environment(value, chosen) -> None:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    from omni_runtime.models.qwen3_omni_moe.loader import experts_implementation

    assert experts_implementation(value) == chosen
    assert chosen == "eager" or chosen in ALL_EXPERTS_FUNCTIONS


def test_default_experts_without_triton_or_for_the_talker_is_grouped_mm(monkeypatch) -> None:
    from omni_runtime.executor import triton_support
    from omni_runtime.models.qwen3_omni_moe.loader import experts_implementation

    assert experts_implementation(None, stage="talker") == "grouped_mm"
    assert experts_implementation("omni_fused", stage="talker") == "omni_fused"  # the variable wins
    monkeypatch.setattr(triton_support, "triton_available", lambda: False)
    assert experts_implementation(None) == "grouped_mm"


def test_omni_fused_also_fuses_the_routers_and_grouped_mm_gives_them_back() -> None:
    from transformers import Qwen3OmniMoeConfig

    from omni_runtime.models.qwen3_omni_moe.loader import experts_implementation, use_experts

    text = Qwen3OmniMoeConfig().thinker_config.text_config
    text.num_experts, text.hidden_size, text.moe_intermediate_size, text.num_experts_per_tok = 4, 8, 4, 2
    model = torch.nn.Sequential(
        hf.Qwen3OmniMoeThinkerTextSparseMoeBlock(text), hf.Qwen3OmniMoeThinkerTextSparseMoeBlock(text)
    )
    assert use_experts(model, experts_implementation("omni_fused")) == 2
    assert {type(block.gate).__name__ for block in model} == {"FusedQwen3OmniMoeThinkerTextTopKRouter"}
    assert use_experts(model, experts_implementation("omni_fused")) == 2  # again: no double wrap
    assert {type(block.gate).__bases__ for block in model} == {(hf.Qwen3OmniMoeThinkerTextTopKRouter,)}
    assert use_experts(model, experts_implementation("grouped_mm")) == 2
    assert {type(block.gate) for block in model} == {hf.Qwen3OmniMoeThinkerTextTopKRouter}


def test_unknown_experts_implementation_names_the_variable() -> None:
    from omni_runtime.contract.engine import EngineError
    from omni_runtime.models.qwen3_omni_moe.loader import experts_implementation

    with pytest.raises(EngineError) as err:
        experts_implementation("triton")
    assert err.value.param == "OMNI_MOE_EXPERTS"
    assert "grouped_mm" in str(err.value)


def test_a_fused_router_on_cpu_tensors_is_transformers_router() -> None:
    from transformers import Qwen3OmniMoeConfig

    from omni_runtime.executor import moe_decode

    text = Qwen3OmniMoeConfig().thinker_config.text_config
    text.num_experts, text.hidden_size, text.num_experts_per_tok = 8, 16, 2
    router = hf.Qwen3OmniMoeThinkerTextTopKRouter(text)
    torch.nn.init.normal_(router.weight)
    x = torch.randn(3, 16)
    want = router(x)
    moe_decode.fuse_routers(router, True)
    for got, expected in zip(router(x), want, strict=True):
        assert torch.equal(got, expected)
