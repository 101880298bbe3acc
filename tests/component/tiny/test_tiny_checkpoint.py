"""The tiny checkpoint: layout, config consistency, loading, and a monolithic generate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from omni_runtime.models.qwen2_5_omni import tiny
from omni_runtime.models.qwen2_5_omni.tiny_processor import (
    BASE_VOCAB_SIZE,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    special_token_ids,
)

EXPECTED_FILES = {
    "README.md",
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "omni_tiny.json",
    "processor_config.json",
    "spk_dict.pt",
    "tokenizer.json",
    "tokenizer_config.json",
}


def test_layout_and_readme(tiny_dir: Path) -> None:
    assert {p.name for p in tiny_dir.iterdir()} == EXPECTED_FILES
    assert "weights in this directory are random" in (tiny_dir / "README.md").read_text()
    size = (tiny_dir / "model.safetensors").stat().st_size
    assert 1_000_000 < size < 20_000_000, size
    assert tiny.is_tiny_checkpoint(tiny_dir)


def test_special_token_ids_follow_the_base_vocab() -> None:
    ids = special_token_ids()
    assert ids["<|endoftext|>"] == BASE_VOCAB_SIZE == 4069
    assert ids["<|im_start|>"] == 4070
    assert ids["<|im_end|>"] == 4071
    assert ids["<|AUDIO|>"] == 4072
    assert ids["<|IMAGE|>"] == 4081
    assert ids["<|VIDEO|>"] == 4082
    assert max(ids.values()) == VOCAB_SIZE - 1
    assert len(set(ids.values())) == len(SPECIAL_TOKENS)


def test_config_ids_match_tokenizer(tiny_dir: Path, tiny_processor) -> None:
    config = json.loads((tiny_dir / "config.json").read_text())
    tok = tiny_processor.tokenizer
    thinker, talker = config["thinker_config"], config["talker_config"]
    assert len(tok) == thinker["text_config"]["vocab_size"] == VOCAB_SIZE
    by_token = {
        "audio_token_index": "<|AUDIO|>",
        "image_token_index": "<|IMAGE|>",
        "video_token_index": "<|VIDEO|>",
        "audio_start_token_id": "<|audio_bos|>",
        "audio_end_token_id": "<|audio_eos|>",
        "vision_start_token_id": "<|vision_bos|>",
        "vision_end_token_id": "<|vision_eos|>",
    }
    for key, token in by_token.items():
        assert thinker[key] == tok.convert_tokens_to_ids(token), key
        assert talker[key] == thinker[key], key
    assert thinker["user_token_id"] == tok.convert_tokens_to_ids("user")
    assert talker["tts_text_pad_token_id"] == tok.convert_tokens_to_ids("<|tts_pad|>")
    assert tok.image_token_id == thinker["image_token_index"]
    assert tok.audio_token_id == thinker["audio_token_index"]
    assert tok.video_token_id == thinker["video_token_index"]
    # The talker's special codec ids fit its vocabulary, and the DiT embeds every codec id.
    codec_ids = [talker[f"tts_codec_{k}_token_id"] for k in ("start", "end", "pad", "mask")]
    assert max(codec_ids) < talker["vocab_size"]
    assert config["token2wav_config"]["dit_config"]["num_embeds"] >= talker["vocab_size"]
    text = thinker["text_config"]
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    assert sum(text["rope_parameters"]["mrope_section"]) == head_dim // 2
    assert sum(talker["rope_parameters"]["mrope_section"]) == talker["head_dim"] // 2
    assert thinker["vision_config"]["num_heads"] == 16


def test_model_and_speakers_load(tiny_model) -> None:
    assert set(tiny_model.speaker_map) == {"Chelsie", "Ethan"}
    ids = special_token_ids()
    for name, entry in tiny_model.speaker_map.items():
        assert entry["bos_token"] == ids[f"<|spk_{name}|>"]
        assert tuple(entry["cond"].shape) == (1, 192)
        assert tuple(entry["ref_mel"].shape) == (1, tiny.SPEAKER_REF_MEL_FRAMES, 80)
    assert tiny_model.dtype == torch.float32


def test_monolithic_generate_text_and_audio(tiny_model, tiny_processor) -> None:
    from PIL import Image

    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "audio"}, {"type": "text", "text": "Hi?"}]}
    ]
    prompt = tiny_processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 255, (56, 84, 3), dtype=np.uint8))
    audio = np.sin(2 * np.pi * 440 * np.arange(8000) / 16000).astype(np.float32)
    inputs = dict(tiny_processor(text=[prompt], images=[image], audio=[audio], return_tensors="pt"))
    n_prompt = inputs["input_ids"].shape[1]

    text_ids = tiny_model.generate(
        **inputs, generation_mode="text", thinker_max_new_tokens=4, thinker_do_sample=False
    )
    assert text_ids.shape[0] == 1 and n_prompt < text_ids.shape[1] <= n_prompt + 4

    # transformers 5.23 forwards un-prefixed pixel_values to the talker, which rejects them:
    # hand them to the thinker explicitly. The runtime drives the submodules and never does this.
    inputs["thinker_pixel_values"] = inputs.pop("pixel_values")
    eos = [tiny.CODEC_PAD, tiny.CODEC_EOS]
    torch.manual_seed(0)
    ids, wav = tiny_model.generate(
        **inputs, speaker="Ethan", thinker_max_new_tokens=4, talker_max_new_tokens=8, talker_eos_token_id=eos
    )
    assert ids.shape[1] > n_prompt
    # 2 mel frames per codec token, 240 samples per mel frame at 24 kHz.
    assert wav.ndim == 1 and 0 < wav.numel() <= 8 * 480 and wav.numel() % 480 == 0
    assert float(wav.abs().max()) > 1e-3  # audible noise, not the ~1e-8 of a default-initialised vocoder
