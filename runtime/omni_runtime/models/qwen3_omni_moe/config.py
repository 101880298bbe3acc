"""Qwen3-Omni-MoE configurations: the released 30B-A3B shape and the tiny test shape.

transformers' ``Qwen3OmniMoeConfig()`` defaults are not the released model (its thinker has 28
layers and a 3584-token vocabulary), so the released shape is written down here from the public
``config.json`` of Qwen/Qwen3-Omni-30B-A3B-Instruct: it is what ``--load-format dummy`` builds
and what GPU numbers are measured on. The tiny config keeps the same layout (a MoE thinker with
audio and vision towers, a MoE talker with a shared expert and a code predictor, Code2Wav) at
sizes a CPU builds in a second.

transformers 5.23 workaround: the talker's MoE block reads ``shared_expert_intermediate_size``,
a field ``Qwen3OmniMoeTalkerTextConfig`` does not declare (so building the default talker raises
``AttributeError``). The released config.json carries it (768); both configs here set it
explicitly, and :func:`build_config` adds it to any talker text config that lacks it. Likewise
the talker's rope indexing reads ``spatial_merge_size`` from ``Qwen3OmniMoeTalkerConfig``, which
does not declare it either (the released config.json carries 2). And that rope indexing reads
``audio_config.n_window`` from the talker config, which has no audio config, whenever a prompt
holds audio and an image or video (transformers' own ``generate`` raises ``AttributeError``
there): :func:`ensure_talker_fields` lends the talker config the thinker's audio config.
"""

from __future__ import annotations

import copy
from typing import Any

# The released talker's shared expert width (its config.json; absent from the 5.23 config class).
RELEASED_TALKER_SHARED_EXPERT = 768

# Released special-token ids (the Qwen3-Omni tokenizer; 151643.. are its added tokens).
RELEASED_TOKEN_IDS = {
    "im_start_token_id": 151644,
    "im_end_token_id": 151645,
    "tts_pad_token_id": 151671,
    "tts_bos_token_id": 151672,
    "tts_eos_token_id": 151673,
    "system_token_id": 8948,
    "user_token_id": 872,
    "assistant_token_id": 77091,
}
_MEDIA_IDS = {
    "audio_token_id": 151675,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "audio_start_token_id": 151669,
    "audio_end_token_id": 151670,
}
_ROPE = {"rope_type": "default", "rope_theta": 1000000, "mrope_section": [24, 20, 20], "interleaved": True}

RELEASED_30B_A3B: dict[str, Any] = {
    "thinker_config": {
        "text_config": {
            "vocab_size": 152064,
            "hidden_size": 2048,
            "intermediate_size": 768,
            "num_hidden_layers": 48,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "max_position_embeddings": 65536,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {**_ROPE, "mrope_interleaved": True},
            "decoder_sparse_step": 1,
            "moe_intermediate_size": 768,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "norm_topk_prob": True,
            "mlp_only_layers": [],
            "tie_word_embeddings": False,
        },
        "audio_config": {
            "num_mel_bins": 128,
            "encoder_layers": 32,
            "encoder_attention_heads": 20,
            "encoder_ffn_dim": 5120,
            "d_model": 1280,
            "output_dim": 2048,
            "max_source_positions": 1500,
            "n_window": 50,
            "n_window_infer": 800,
            "conv_chunksize": 500,
            "downsample_hidden_size": 480,
        },
        "vision_config": {
            "depth": 27,
            "hidden_size": 1152,
            "hidden_act": "gelu_pytorch_tanh",
            "intermediate_size": 4304,
            "num_heads": 16,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": 2048,
            "num_position_embeddings": 2304,
            "deepstack_visual_indexes": [8, 16, 24],
        },
        **_MEDIA_IDS,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "position_id_per_seconds": 13,
        "seconds_per_chunk": 2,
        "user_token_id": 872,
        "tie_word_embeddings": False,
    },
    "talker_config": {
        "text_config": {
            "vocab_size": 3072,
            "hidden_size": 1024,
            "intermediate_size": 2048,
            "num_hidden_layers": 20,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "head_dim": 128,
            "max_position_embeddings": 65536,
            "rms_norm_eps": 1e-6,
            "rope_parameters": _ROPE,
            "decoder_sparse_step": 1,
            "moe_intermediate_size": 384,
            "shared_expert_intermediate_size": RELEASED_TALKER_SHARED_EXPERT,
            "num_experts": 128,
            "num_experts_per_tok": 6,
            "norm_topk_prob": True,
            "mlp_only_layers": [],
        },
        "code_predictor_config": {
            "vocab_size": 2048,
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 5,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000},
            "num_code_groups": 16,
        },
        "num_code_groups": 16,
        "thinker_hidden_size": 2048,
        "accept_hidden_layer": 24,
        "codec_pad_id": 2148,
        "codec_bos_id": 2149,
        "codec_eos_token_id": 2150,
        "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157,
        "speaker_id": {"chelsie": 2301, "ethan": 2302, "aiden": 2303},
        **_MEDIA_IDS,
        "vision_start_token_id": 151652,
        "position_id_per_seconds": 13,
        "seconds_per_chunk": 2,
        "spatial_merge_size": 2,
    },
    "code2wav_config": {
        "codebook_size": 2048,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 8,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "max_position_embeddings": 8000,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000},
        "sliding_window": 72,
        "num_quantizers": 16,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "decoder_dim": 1536,
        "rms_norm_eps": 1e-5,
    },
    "enable_audio_output": True,
    **RELEASED_TOKEN_IDS,
}


def build_config(values: dict[str, Any]) -> Any:
    """A ``Qwen3OmniMoeConfig`` from nested values, with the 5.23 talker field filled in."""
    from transformers import Qwen3OmniMoeConfig

    values = copy.deepcopy(values)
    talker_text = values.setdefault("talker_config", {}).setdefault("text_config", {})
    # transformers 5.23: Qwen3OmniMoeTalkerTextConfig lacks the field its MoE block reads.
    talker_text.setdefault("shared_expert_intermediate_size", RELEASED_TALKER_SHARED_EXPERT)
    # ... and Qwen3OmniMoeTalkerConfig lacks the spatial_merge_size its rope indexing reads.
    values["talker_config"].setdefault("spatial_merge_size", 2)
    return Qwen3OmniMoeConfig(**values)


def released_30b_a3b_config() -> Any:
    """The released Qwen3-Omni-30B-A3B configuration (public config.json values)."""
    return build_config(RELEASED_30B_A3B)


def ensure_talker_fields(config: Any) -> Any:
    """A config read from disk: give its talker configs the fields 5.23 reads (in place)."""
    talker = getattr(config, "talker_config", None)
    text = getattr(talker, "text_config", None)
    if text is not None and getattr(text, "shared_expert_intermediate_size", None) is None:
        text.shared_expert_intermediate_size = RELEASED_TALKER_SHARED_EXPERT
    if talker is not None and getattr(talker, "spatial_merge_size", None) is None:
        talker.spatial_merge_size = 2
    thinker = getattr(config, "thinker_config", None)
    if talker is not None and thinker is not None and getattr(talker, "audio_config", None) is None:
        talker.audio_config = thinker.audio_config  # read at load, never saved
    return config


def _media_ids(ids: dict[str, int]) -> dict[str, int]:
    """The config's media placeholder ids from a tokenizer's special-token ids."""
    return {
        "audio_token_id": ids["<|audio_pad|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "audio_start_token_id": ids["<|audio_start|>"],
        "audio_end_token_id": ids["<|audio_end|>"],
    }


def tiny_config_dict(ids: dict[str, int], *, vocab_size: int, thinker_hidden: int) -> dict[str, Any]:
    """The tiny model's nested config values: the released layout at toy sizes.

    ``ids`` maps the tokenizer's special tokens to ids (see tiny_processor.special_token_ids).
    """
    head_dim = 16
    rope = {"rope_type": "default", "rope_theta": 1000000, "mrope_section": [4, 2, 2], "interleaved": True}
    media = _media_ids(ids)
    vision_start = ids["<|vision_start|>"]
    thinker = {
        "text_config": {
            "vocab_size": vocab_size,
            "hidden_size": thinker_hidden,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": thinker_hidden // head_dim,
            "num_key_value_heads": 4,
            "head_dim": head_dim,
            "max_position_embeddings": 32768,
            "rope_parameters": {**rope, "mrope_interleaved": True},
            "moe_intermediate_size": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "tie_word_embeddings": False,
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        "audio_config": {
            "num_mel_bins": 128,
            "encoder_layers": 2,
            "encoder_attention_heads": 4,
            "encoder_ffn_dim": 128,
            "d_model": 64,
            "output_dim": thinker_hidden,
            "max_source_positions": 1500,
            "n_window": 50,  # the processor's default: the two must agree
            "n_window_infer": 800,
            "conv_chunksize": 500,
            "downsample_hidden_size": 32,
        },
        "vision_config": {
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 4,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": thinker_hidden,
            "num_position_embeddings": 2304,
            "deepstack_visual_indexes": [1],
        },
        **media,
        "vision_start_token_id": vision_start,
        "vision_end_token_id": ids["<|vision_end|>"],
        "position_id_per_seconds": 13,
        "user_token_id": ids["user"],
    }
    talker = {
        "text_config": {
            "vocab_size": 3072,  # the released codec vocabulary: its special ids (2148..2303) stay valid
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": head_dim,
            "rope_parameters": rope,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 64,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
        },
        "code_predictor_config": {
            "vocab_size": 2048,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": head_dim,
            "num_code_groups": 4,
        },
        "num_code_groups": 4,
        "thinker_hidden_size": thinker_hidden,
        "accept_hidden_layer": 1,
        **{k: RELEASED_30B_A3B["talker_config"][k] for k in _CODEC_KEYS},
        **media,
        "vision_start_token_id": vision_start,
        "position_id_per_seconds": 13,
        "spatial_merge_size": 2,
    }
    code2wav = {
        "codebook_size": 2048,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "sliding_window": 72,
        "num_quantizers": 4,  # = num_code_groups
        "upsample_rates": [8, 5, 4, 3],  # 1920 samples per frame: 24 kHz at 12.5 frames/s, as released
        "upsampling_ratios": [2, 2],
        "decoder_dim": 64,
    }
    return {
        "thinker_config": thinker,
        "talker_config": talker,
        "code2wav_config": code2wav,
        "enable_audio_output": True,
        "im_start_token_id": ids["<|im_start|>"],
        "im_end_token_id": ids["<|im_end|>"],
        "tts_pad_token_id": ids["<tts_pad>"],
        "tts_bos_token_id": ids["<tts_text_bos>"],
        "tts_eos_token_id": ids["<tts_text_eod>"],
        "system_token_id": ids["system"],
        "user_token_id": ids["user"],
        "assistant_token_id": ids["assistant"],
    }


_CODEC_KEYS = (
    "codec_pad_id",
    "codec_bos_id",
    "codec_eos_token_id",
    "codec_nothink_id",
    "codec_think_bos_id",
    "codec_think_eos_id",
    "speaker_id",
)


def released_shape_dict(ids: dict[str, int]) -> dict[str, Any]:
    """The released 30B-A3B values with every special-token id taken from ``ids`` (another
    tokenizer's, as in tiny_config_dict): the released shapes served with a small tokenizer,
    for random weights (``--load-format dummy``) where the released tokenizer is not at hand."""
    values = copy.deepcopy(RELEASED_30B_A3B)
    media = {**_media_ids(ids), "vision_start_token_id": ids["<|vision_start|>"]}
    values["thinker_config"].update(
        media, vision_end_token_id=ids["<|vision_end|>"], user_token_id=ids["user"]
    )
    values["talker_config"].update(media)
    values.update(
        im_start_token_id=ids["<|im_start|>"],
        im_end_token_id=ids["<|im_end|>"],
        tts_pad_token_id=ids["<tts_pad>"],
        tts_bos_token_id=ids["<tts_text_bos>"],
        tts_eos_token_id=ids["<tts_text_eod>"],
        system_token_id=ids["system"],
        user_token_id=ids["user"],
        assistant_token_id=ids["assistant"],
    )
    return values
