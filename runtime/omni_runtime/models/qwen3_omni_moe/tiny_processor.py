"""Tokenizer and processor for the tiny Qwen3-Omni-MoE checkpoint, made offline.

The tiny checkpoint loads through ``Qwen3OmniMoeProcessor.from_pretrained`` like the released
one, so it needs a real tokenizer: the same locally trained byte-level BPE as the tiny
Qwen2.5-Omni tokenizer, followed by the Qwen3-Omni added tokens in the released order (151643..
there), so their ids sit right after the base vocabulary. Sub-processors are the released kinds:
a Qwen2-VL image and video processor with 16-pixel patches and a 128-bin Whisper front end.
"""

from __future__ import annotations

from typing import Any

from omni_runtime.models.qwen2_5_omni.tiny_processor import VOCAB_SIZE, assemble_processor, train_tokenizer

# The released Qwen3-Omni added tokens, in id order (151643 ... 151675 there).
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)
BASE_VOCAB_SIZE = VOCAB_SIZE - len(SPECIAL_TOKENS)

# The talker finds turns by their role token (system_token_id, user_token_id, assistant_token_id
# in the config): the corpus repeats the role names so each is one token, as in the released vocab.
ROLE_CORPUS: tuple[str, ...] = ("system", "user", "assistant") * 64

# Attribute names Qwen3OmniMoeProcessor reads from its tokenizer (tokenizer.image_token, ...).
EXTRA_SPECIAL_TOKENS = {
    "image_token": "<|image_pad|>",
    "audio_token": "<|audio_pad|>",
    "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}

# The Qwen3-Omni chat layout: one placeholder per medium between its start/end tokens, expanded
# by the processor; no default system turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "<|audio_start|><|audio_pad|><|audio_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def special_token_ids() -> dict[str, int]:
    """Ids of :data:`SPECIAL_TOKENS`; fixed by construction (they follow the base vocabulary)."""
    return {token: BASE_VOCAB_SIZE + index for index, token in enumerate(SPECIAL_TOKENS)}


def build_processor(*, min_pixels: int, max_pixels: int) -> Any:
    """Assemble a ``Qwen3OmniMoeProcessor`` from the trained tokenizer and stock sub-processors."""
    from transformers import Qwen3OmniMoeProcessor

    # Patch 16, temporal patch 2, merge 2: the Qwen3-Omni vision tower's geometry.
    return assemble_processor(
        Qwen3OmniMoeProcessor,
        tokenizer_object=train_tokenizer(SPECIAL_TOKENS, ROLE_CORPUS),
        extra_special_tokens=EXTRA_SPECIAL_TOKENS,
        chat_template=CHAT_TEMPLATE,
        patch_size=16,
        min_pixels=min_pixels,
        max_pixels=max_pixels,
    )
