"""Tokenizer and processor for the tiny Qwen2.5-Omni checkpoint, made offline.

The tiny checkpoint must load through the same code path as the real one
(``Qwen2_5OmniProcessor.from_pretrained``), so it needs a real tokenizer, not a stub. We train a
byte-level BPE with the ``tokenizers`` library on text gathered locally (docstrings of a fixed
set of standard-library modules plus generated chat-like sentences), then append the chat and
omni special tokens in the same order the released Qwen2.5-Omni tokenizer has them. Their ids
therefore sit right after the base vocabulary and never collide with it; the model config takes
its token ids from :data:`SPECIAL_TOKENS` via :func:`special_token_ids`.
"""

from __future__ import annotations

import ast
import random
import sysconfig
import time
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

# The whole vocabulary (base BPE + special tokens) is exactly this size, so every id the random
# thinker can emit decodes to a token (no padded, unnamed ids) and the embedding splits evenly.
VOCAB_SIZE = 4096

# Order mirrors the released Qwen2.5-Omni tokenizer (151643.. there); the tts and speaker tokens
# live past the tokenizer there (151859..151873) and are named tokens here.
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|vision_pad|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<|tts_pad|>",
    "<|tts_text_bos|>",
    "<|tts_text_eos|>",
    "<|spk_Chelsie|>",
    "<|spk_Ethan|>",
)
BASE_VOCAB_SIZE = VOCAB_SIZE - len(SPECIAL_TOKENS)

# Attribute names the Qwen2.5-Omni processor reads from its tokenizer (tokenizer.image_token, ...).
EXTRA_SPECIAL_TOKENS = {
    "image_token": "<|IMAGE|>",
    "audio_token": "<|AUDIO|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
}

DEFAULT_SYSTEM_PROMPT = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving "
    "auditory and visual inputs, as well as generating text and speech."
)

# The Qwen2.5-Omni chat template: one placeholder token per medium, expanded by the processor.
CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}{% set image_count = namespace(value=0) %}"
    "{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "{% if add_audio_id %}Audio {{ audio_count.value }}: {% endif %}"
    "<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_bos|><|VIDEO|><|vision_eos|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Standard-library modules whose docstrings make the English part of the corpus. A fixed list
# keeps the corpus (and so the merges) the same on every machine with the same Python.
_CORPUS_MODULES = (
    "argparse", "asyncio/base_events", "asyncio/streams", "asyncio/tasks", "calendar", "collections/__init__",
    "configparser", "contextlib", "csv", "dataclasses", "datetime", "decimal", "difflib", "email/message",
    "enum", "fractions", "ftplib", "functools", "gettext", "gzip", "heapq", "http/client", "http/server",
    "imaplib", "inspect", "ipaddress", "json/__init__", "logging/__init__", "mailbox", "os", "pathlib",
    "pickle", "pydoc", "random", "shutil", "smtplib", "socket", "statistics", "string", "subprocess",
    "tarfile", "tempfile", "textwrap", "threading", "typing", "unittest/case", "urllib/parse", "uuid",
    "wave", "zipfile",
)  # fmt: skip

_SUBJECTS = ("the cat", "a child", "my friend", "the teacher", "our team", "the robot", "a bird", "the city")
_VERBS = ("sees", "hears", "describes", "paints", "likes", "answers", "sings about", "remembers")
_OBJECTS = ("a red apple", "the blue sky", "a loud song", "the old house", "a short video", "this picture")
_PROMPTS = (
    "What is in this image?",
    "Please describe the audio.",
    "What happens in the video?",
    "Tell me a short story.",
    "Hello, how are you today?",
    "Can you say that again, slowly?",
    "Thank you, that was helpful.",
)


def _parse(source: str) -> ast.Module:
    """``ast.parse``, retried when CPython 3.11's AST conversion trips over another thread's.

    Before 3.12 the conversion's recursion-depth check lives in interpreter-wide state, so a parse
    running in another thread at the same moment (a library importing lazily, a worker thread of
    a test) can make it raise ``SystemError: AST constructor recursion depth mismatch``. The
    source is the same every time, so a retry gives the same tree.
    """
    for attempt in range(30):
        try:
            return ast.parse(source)
        except SystemError:
            time.sleep(min(0.01 * 2**attempt, 0.5))  # the other parse is short: it ends soon
    return ast.parse(source)


def build_corpus() -> list[str]:
    """Return the training text: stdlib docstrings and seeded, generated chat-like sentences."""
    lines: list[str] = []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in _CORPUS_MODULES:
        path = stdlib / f"{name}.py"
        if not path.is_file():
            continue  # a trimmed Python install: the generated part below still makes a corpus
        tree = _parse(path.read_text(encoding="utf-8", errors="replace"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    lines.extend(part for part in doc.splitlines() if part.strip())
    rng = random.Random(0)  # the tokenizer never depends on the weight seed: one vocabulary for all
    for _ in range(4000):
        sentence = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}."
        lines.append(sentence.capitalize())
        lines.append(rng.choice(_PROMPTS))
    lines.append(DEFAULT_SYSTEM_PROMPT)
    lines.extend(("system", "user", "assistant", "You are a helpful assistant."))
    return lines


def train_tokenizer(
    special_tokens: tuple[str, ...] = SPECIAL_TOKENS, extra_corpus: tuple[str, ...] = ()
) -> Tokenizer:
    """Train the byte-level BPE and append ``special_tokens`` after the base vocabulary, so the
    whole vocabulary is :data:`VOCAB_SIZE` (another family passes its own special tokens, and
    lines whose words it needs as single tokens)."""
    base_size = VOCAB_SIZE - len(special_tokens)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=base_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator([*build_corpus(), *extra_corpus], trainer=trainer)
    base = tokenizer.get_vocab_size()
    if base != base_size:
        raise RuntimeError(f"tokenizer corpus too small: trained {base} tokens, need {base_size}")
    tokenizer.add_special_tokens(list(special_tokens))
    return tokenizer


def special_token_ids() -> dict[str, int]:
    """Ids of :data:`SPECIAL_TOKENS`; fixed by construction (they follow the base vocabulary)."""
    return {token: BASE_VOCAB_SIZE + index for index, token in enumerate(SPECIAL_TOKENS)}


def build_processor(*, max_pixels: int, min_pixels: int):
    """Assemble a ``Qwen2_5OmniProcessor`` from the trained tokenizer and stock sub-processors."""
    from transformers import Qwen2_5OmniProcessor

    # Patch 14, temporal patch 2, merge 2: the Qwen2.5-Omni vision tower's geometry.
    return assemble_processor(
        Qwen2_5OmniProcessor,
        tokenizer_object=train_tokenizer(),
        extra_special_tokens=EXTRA_SPECIAL_TOKENS,
        chat_template=CHAT_TEMPLATE,
        patch_size=14,
        min_pixels=min_pixels,
        max_pixels=max_pixels,
    )


def assemble_processor(
    processor_class: Any,
    *,
    tokenizer_object: Any,
    extra_special_tokens: Any,
    chat_template: str,
    patch_size: int,
    min_pixels: int,
    max_pixels: int,
) -> Any:
    """A Qwen omni processor (either family) from a trained tokenizer and stock sub-processors:
    Qwen2-VL image and video processors with the tower's patch size (temporal patch 2, merge 2)
    and the Whisper-v3 front end (128 mel bins at 16 kHz) both families' audio towers expect."""
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
        WhisperFeatureExtractor,
    )

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer_object,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=32768,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        extra_special_tokens=extra_special_tokens,
        chat_template=chat_template,
    )
    image_processor = Qwen2VLImageProcessor(
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        patch_size=patch_size,
        temporal_patch_size=2,
        merge_size=2,
    )
    # cap_pixels_per_frame: the qwen-vl-utils reference behaviour, the default from transformers 5.22 on.
    video_processor = Qwen2VLVideoProcessor(
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        patch_size=patch_size,
        temporal_patch_size=2,
        merge_size=2,
        cap_pixels_per_frame=True,
    )
    feature_extractor = WhisperFeatureExtractor(feature_size=128, sampling_rate=16000)
    return processor_class(
        image_processor=image_processor,
        video_processor=video_processor,
        feature_extractor=feature_extractor,
        tokenizer=tokenizer,
        chat_template=chat_template,
    )
