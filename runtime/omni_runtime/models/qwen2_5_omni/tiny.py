"""The tiny random-weight Qwen2.5-Omni checkpoint (`omni tiny-checkpoint DIR`, entrypoints/tiny_checkpoint.py).

It is the embedded default model: `omni serve` with no model path creates it once in the cache
directory and serves it, and every CPU test drives the real pipeline with it. It has the real
on-disk layout (config.json, model.safetensors, generation_config.json, tokenizer and processor
files, spk_dict.pt), so the adapter loads it through exactly the code that loads the released
7B checkpoint; only the sizes are small and the weights random. Creation takes seconds on a CPU.

Library use::

    from omni_runtime.models.qwen2_5_omni.tiny import ensure_tiny_checkpoint
    path = ensure_tiny_checkpoint()      # $OMNI_CACHE_DIR/tiny or ~/.cache/omni/tiny, made once
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omni_runtime.models.qwen2_5_omni.tiny_processor import (
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    build_processor,
    special_token_ids,
)

# Bump when the checkpoint's contents change, so an old cached copy is replaced, not served.
TINY_FORMAT_VERSION = 1
MARKER = "omni_tiny.json"  # its presence (and format version) marks a tiny checkpoint

# Talker codec vocabulary: codes 0..999 are audio codes; the special codec ids keep the released
# model's offsets from each other (8292, 8293, 8294, 8296 there). Code must read them from the config.
CODEC_VOCAB_SIZE = 1024
CODEC_PAD, CODEC_BOS, CODEC_EOS, CODEC_MASK = 1000, 1001, 1002, 1004

THINKER_HIDDEN = 128
SPEAKERS = ("Chelsie", "Ethan")
SPEAKER_REF_MEL_FRAMES = 64
OUTPUT_SAMPLE_RATE = 24000  # BigVGAN upsampling 5*3*2*2*2*2 = 240 samples per mel frame at 100 frames/s
INPUT_SAMPLE_RATE = 16000
IMAGE_MIN_PIXELS = 56 * 56
IMAGE_MAX_PIXELS = 256 * 28 * 28  # caps the vision tokens of one image at 256 on the tiny model

README = """\
# Tiny Qwen2.5-Omni checkpoint (random weights)

**The weights in this directory are random.** The model produces meaningless text and noise for
audio. It exists so the serving runtime can be built, tested and demonstrated on a CPU in
seconds, with the real Qwen2.5-Omni on-disk layout and a real (locally trained) BPE tokenizer.

Made by `omni tiny-checkpoint` (format version {version}, seed {seed}).

- thinker: text hidden {hidden}, 2 layers, vocab {vocab}; audio tower and vision tower 2 layers each
- talker: codec vocab {codec}; token2wav: DiT + BigVGAN, {rate} Hz output
- speakers: {speakers}
"""


def default_cache_dir() -> Path:
    """$OMNI_CACHE_DIR, else ~/.cache/omni."""
    env = os.environ.get("OMNI_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "omni"


def tiny_config_dict(*, user_token_id: int) -> dict[str, Any]:
    """The Qwen2_5OmniConfig of the tiny model, as keyword arguments (token ids from the tokenizer)."""
    ids = special_token_ids()
    head_dim = 16
    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]}  # sums to head_dim/2
    vision_ids = {
        "vision_start_token_id": ids["<|vision_bos|>"],
        "vision_end_token_id": ids["<|vision_eos|>"],
        "vision_token_id": ids["<|vision_pad|>"],
    }
    media_ids = {
        "audio_token_index": ids["<|AUDIO|>"],
        "image_token_index": ids["<|IMAGE|>"],
        "video_token_index": ids["<|VIDEO|>"],
        "audio_start_token_id": ids["<|audio_bos|>"],
        "audio_end_token_id": ids["<|audio_eos|>"],
    }
    text_config = {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": THINKER_HIDDEN,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": THINKER_HIDDEN // head_dim,  # 8: thinker TP 1, 2, 4 or 8
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        "rope_parameters": rope,
        "tie_word_embeddings": False,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }
    audio_config = {
        "num_mel_bins": 128,
        "encoder_layers": 2,
        "encoder_attention_heads": 4,
        "encoder_ffn_dim": 128,
        "d_model": 64,
        "output_dim": THINKER_HIDDEN,
        "n_window": 100,
        "max_source_positions": 1500,
    }
    vision_config = {
        "depth": 2,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_heads": 16,  # the real tower's 16 heads, so image-encoder TP 1/2/4/8/16 plans hold
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "out_hidden_size": THINKER_HIDDEN,
        "fullatt_block_indexes": [1],
    }
    thinker_config = {
        "text_config": text_config,
        "audio_config": audio_config,
        "vision_config": vision_config,
        "user_token_id": user_token_id,  # the BPE token "user", as 872 is in the released vocab
        **media_ids,
        **vision_ids,
    }
    talker_config = {
        "vocab_size": CODEC_VOCAB_SIZE,
        "embedding_size": THINKER_HIDDEN,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": head_dim,
        "rope_parameters": rope,
        "tts_text_start_token_id": ids["<|tts_text_bos|>"],
        "tts_text_end_token_id": ids["<|tts_text_eos|>"],
        "tts_text_pad_token_id": ids["<|tts_pad|>"],
        "tts_codec_start_token_id": CODEC_BOS,
        "tts_codec_end_token_id": CODEC_EOS,
        "tts_codec_pad_token_id": CODEC_PAD,
        "tts_codec_mask_token_id": CODEC_MASK,
        "vision_start_token_id": vision_ids["vision_start_token_id"],
        "vision_end_token_id": vision_ids["vision_end_token_id"],
        **media_ids,
    }
    dit_config = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "head_dim": 16,
        "ff_mult": 2,
        "emb_dim": 32,
        "look_ahead_layers": [1],
        "look_backward_layers": [0, 1],
        "repeats": 2,
        "num_embeds": CODEC_VOCAB_SIZE,  # a random talker emits any codec id: cover the whole vocab
        "mel_dim": 80,
        "dropout": 0.0,
        "enc_emb_dim": 192,  # speaker `cond` width
        "enc_dim": 32,
        "enc_channels": [32, 32, 32, 32, 96],
        "enc_attention_channels": 16,
        "enc_se_channels": 16,
    }
    bigvgan_config = {
        "mel_dim": 80,
        "upsample_initial_channel": 64,  # below 64 the last upsampling stage has no channels left
        "resblock_kernel_sizes": [3, 7, 11],
        "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
        "upsample_rates": [5, 3, 2, 2, 2, 2],
        "upsample_kernel_sizes": [11, 7, 4, 4, 4, 4],
    }
    return {
        "thinker_config": thinker_config,
        "talker_config": talker_config,
        "token2wav_config": {"dit_config": dit_config, "bigvgan_config": bigvgan_config},
        "enable_audio_output": True,
    }


def _speaker_dict(generator) -> dict[str, dict[str, Any]]:
    import torch

    ids = special_token_ids()
    return {
        name: {
            "bos_token": ids[f"<|spk_{name}|>"],
            "cond": torch.randn(1, 192, generator=generator),
            "ref_mel": torch.randn(1, SPEAKER_REF_MEL_FRAMES, 80, generator=generator),
        }
        for name in SPEAKERS
    }


def _make_vocoder_audible(model, *, generator) -> None:
    """Scale BigVGAN's last conv so random weights give noise at about 0.1 RMS, not near-silence.

    With default init (std 0.02) the signal shrinks through six upsampling stages to ~1e-8, which
    a test cannot tell from silence. One seeded forward on a random mel measures the level.
    """
    import torch

    vocoder = model.token2wav.code2wav_bigvgan_model
    with torch.no_grad():
        mel = torch.randn(1, 80, 20, generator=generator)
        rms = vocoder(mel).float().pow(2).mean().sqrt().clamp(min=1e-12)
        vocoder.conv_post.weight.mul_(0.1 / rms)


def create_tiny_checkpoint(path: str | Path, *, seed: int = 0, progress: bool = True) -> Path:
    """Write the tiny checkpoint into ``path`` (created; existing files are overwritten)."""
    started = time.monotonic()

    def step(message: str) -> None:
        if progress:
            print(
                f"[tiny-checkpoint {time.monotonic() - started:5.1f}s] {message}", file=sys.stderr, flush=True
            )

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    step("loading torch and transformers")
    from transformers.utils import logging as hf_logging

    # The talker config names thinker-vocabulary ids (tts_text_*, vision_*), which transformers'
    # config validation flags against the codec vocabulary on every build; that is by design.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return _create(out, seed=seed, step=step)
    finally:
        hf_logging.set_verbosity(verbosity)


def _create(out: Path, *, seed: int, step) -> Path:
    import torch
    from transformers import GenerationConfig, Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

    step("training the BPE tokenizer")
    processor = build_processor(min_pixels=IMAGE_MIN_PIXELS, max_pixels=IMAGE_MAX_PIXELS)
    processor.save_pretrained(out)

    step("building the model with random weights")
    user_token_id = processor.tokenizer.convert_tokens_to_ids("user")
    config = Qwen2_5OmniConfig(**tiny_config_dict(user_token_id=user_token_id))
    torch.manual_seed(seed)
    model = Qwen2_5OmniForConditionalGeneration(config).float().eval()
    _make_vocoder_audible(model, generator=torch.Generator().manual_seed(seed + 2))
    ids = special_token_ids()
    model.generation_config = GenerationConfig(
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], pad_token_id=ids["<|endoftext|>"]
    )
    n_params = sum(p.numel() for p in model.parameters())
    step(f"saving {n_params / 1e6:.2f}M parameters")
    model.save_pretrained(out)

    generator = torch.Generator().manual_seed(seed + 1)
    torch.save(_speaker_dict(generator), out / "spk_dict.pt")
    (out / "README.md").write_text(
        README.format(
            version=TINY_FORMAT_VERSION,
            seed=seed,
            hidden=THINKER_HIDDEN,
            vocab=VOCAB_SIZE,
            codec=CODEC_VOCAB_SIZE,
            rate=OUTPUT_SAMPLE_RATE,
            speakers=", ".join(SPEAKERS),
        ),
        encoding="utf-8",
    )
    marker = {"format_version": TINY_FORMAT_VERSION, "seed": seed, "random_weights": True}
    (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    step(f"done: {out}")
    return out


def is_tiny_checkpoint(path: str | Path) -> bool:
    """True when ``path`` holds a complete tiny checkpoint of the current format."""
    marker = Path(path) / MARKER
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return data.get("format_version") == TINY_FORMAT_VERSION


def ensure_tiny_checkpoint(cache_dir: str | Path | None = None, *, progress: bool = True) -> Path:
    """Return ``<cache>/tiny``, creating it once."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return ensure_checkpoint(
        root / "tiny",
        create=lambda staging: create_tiny_checkpoint(staging, progress=progress),
        is_ready=is_tiny_checkpoint,
    )


def ensure_checkpoint(
    target: Path, *, create: Callable[[Path], Any], is_ready: Callable[[Path], bool]
) -> Path:
    """Return ``target``, made once by ``create`` (every family's cached tiny checkpoint).

    Creation writes to a temporary sibling directory and renames it into place, so a crash or a
    concurrent creator never leaves a half-written checkpoint where a server would load it.
    """
    if is_ready(target):
        return target
    root = target.parent
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-", dir=root))
    try:
        create(staging)
        # mkdtemp and safetensors make owner-only files; a shared cache must be readable by all.
        staging.chmod(0o755)
        for file in staging.iterdir():
            file.chmod(0o644)
        if target.exists():
            if is_ready(target):  # another process won the race
                return target
            shutil.rmtree(target)  # stale format or a broken leftover
        try:
            os.replace(staging, target)
        except OSError:
            if not is_ready(target):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


__all__ = [
    "CODEC_BOS",
    "CODEC_EOS",
    "CODEC_MASK",
    "CODEC_PAD",
    "INPUT_SAMPLE_RATE",
    "OUTPUT_SAMPLE_RATE",
    "SPEAKERS",
    "SPECIAL_TOKENS",
    "create_tiny_checkpoint",
    "default_cache_dir",
    "ensure_tiny_checkpoint",
    "is_tiny_checkpoint",
    "tiny_config_dict",
]
