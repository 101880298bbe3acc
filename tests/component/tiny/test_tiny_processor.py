"""The processor saved with the tiny checkpoint: chat template and image/audio/video expansion."""

from __future__ import annotations

import numpy as np

from omni_runtime.models.qwen2_5_omni.tiny import INPUT_SAMPLE_RATE


def test_text_round_trip(tiny_processor) -> None:
    tok = tiny_processor.tokenizer
    text = "Hello, how are you today? Ünïcödé and emoji 🙂 survive byte-level BPE."
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert (
        tok.convert_ids_to_tokens(tok.encode("<|im_start|>user", add_special_tokens=False))[0]
        == "<|im_start|>"
    )


def test_chat_template_layout(tiny_processor) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]},
    ]
    prompt = tiny_processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n<|vision_bos|><|VIDEO|><|vision_eos|>What happens?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_image_audio_video_placeholders_expand(tiny_processor) -> None:
    tok = tiny_processor.tokenizer
    prompt = (
        "<|im_start|>user\n<|vision_bos|><|IMAGE|><|vision_eos|><|audio_bos|><|AUDIO|><|audio_eos|>"
        "<|vision_bos|><|VIDEO|><|vision_eos|>Describe.<|im_end|>\n<|im_start|>assistant\n"
    )
    rng = np.random.default_rng(1)
    image = rng.integers(0, 255, (56, 112, 3), dtype=np.uint8)  # 4 x 8 patches of 14 px
    # The omni processor's own video default (min 128 * 28 * 28 pixels) upsizes frames to 336 px.
    video = rng.integers(0, 255, (4, 56, 56, 3), dtype=np.uint8)
    audio = rng.standard_normal(INPUT_SAMPLE_RATE).astype(np.float32)  # 1 s at 16 kHz
    out = tiny_processor(text=[prompt], images=[image], videos=[video], audio=[audio], return_tensors="pt")
    ids = out["input_ids"][0]
    assert out["image_grid_thw"].tolist() == [[1, 4, 8]]
    assert out["video_grid_thw"].tolist() == [[2, 24, 24]]
    assert int((ids == tok.image_token_id).sum()) == 1 * 4 * 8 // 4
    assert int((ids == tok.video_token_id).sum()) == 2 * 24 * 24 // 4
    # 100 mel frames per second, halved twice by the audio tower's convolutions and pooling.
    assert int((ids == tok.audio_token_id).sum()) == 25
    assert tuple(out["input_features"].shape[:2]) == (1, 128)
    assert int(out["feature_attention_mask"].sum()) == 100
