"""The tiny random-weight Qwen3-Omni-MoE checkpoint (`omni tiny-checkpoint --family qwen3_omni_moe`).

The released 30B-A3B layout at toy sizes (config.json with model_type ``qwen3_omni_moe``,
model.safetensors as transformers saves ``Qwen3OmniMoeForConditionalGeneration``,
generation_config.json, tokenizer and processor files ``Qwen3OmniMoeProcessor`` loads), so the
adapter loads it through the code that loads the released checkpoint and CPU tests compare the
runtime with transformers' own ``generate``. Creation takes seconds on a CPU.

Library use::

    from omni_runtime.models.qwen3_omni_moe.tiny import ensure_tiny_checkpoint
    path = ensure_tiny_checkpoint()      # $OMNI_CACHE_DIR/tiny-qwen3-omni-moe, made once
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from omni_runtime.models.qwen2_5_omni.tiny import default_cache_dir, ensure_checkpoint
from omni_runtime.models.qwen3_omni_moe.config import build_config, released_shape_dict, tiny_config_dict
from omni_runtime.models.qwen3_omni_moe.tiny_processor import VOCAB_SIZE, build_processor, special_token_ids

# Bump when the checkpoint's contents change, so an old cached copy is replaced, not served.
TINY_FORMAT_VERSION = 2
_MARKER = "omni_tiny.json"
CACHE_NAME = "tiny-qwen3-omni-moe"
THINKER_HIDDEN = 128
IMAGE_MIN_PIXELS = 64 * 64
IMAGE_MAX_PIXELS = 256 * 32 * 32  # caps the vision tokens of one image at 256 on the tiny model

README = """\
# Tiny Qwen3-Omni-MoE checkpoint (random weights)

**The weights in this directory are random.** The model produces meaningless text. It exists so
the serving runtime can be built, tested and demonstrated on a CPU in seconds, with the real
Qwen3-Omni-MoE on-disk layout and a real (locally trained) BPE tokenizer.

Made by `omni tiny-checkpoint --family qwen3_omni_moe` (format version {version}, seed {seed}).

- thinker: MoE text model, hidden {hidden}, 2 layers, 8 experts (top 2), vocab {vocab};
  audio tower and vision tower 2 layers each
- talker: MoE (4 experts + a shared expert), code predictor for {groups} codebooks; Code2Wav 24 kHz
"""


def _token_ids(processor: Any) -> dict[str, int]:
    ids = dict(special_token_ids())
    for role in ("system", "user", "assistant"):
        ids[role] = processor.tokenizer.convert_tokens_to_ids(role)
    return ids


def tiny_config(processor: Any) -> Any:
    """The tiny ``Qwen3OmniMoeConfig`` with token ids from ``processor``'s tokenizer."""
    return build_config(
        tiny_config_dict(_token_ids(processor), vocab_size=VOCAB_SIZE, thinker_hidden=THINKER_HIDDEN)
    )


def create_released_shape(path: str | Path) -> Path:
    """Write the released 30B-A3B shape with no weights, for ``omni serve --load-format dummy``.

    config.json has the released shapes (48 MoE layers of 128 experts, the released towers,
    talker and Code2Wav) with the special-token ids of the tiny tokenizer written beside it, so
    the runtime serves the real thinker size with random weights and no download. Tokens past the
    tokenizer's 4096 are never sampled (the runtime samples decodable ids only).
    """
    from transformers import GenerationConfig

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    processor = build_processor(min_pixels=IMAGE_MIN_PIXELS, max_pixels=IMAGE_MAX_PIXELS)
    processor.save_pretrained(out)
    build_config(released_shape_dict(_token_ids(processor))).save_pretrained(out)
    ids = special_token_ids()
    GenerationConfig(eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]]).save_pretrained(out)
    (out / "README.md").write_text(
        "# Qwen3-Omni-30B-A3B shape, no weights\n\nServe with `omni serve --model-path DIR --load-format dummy "
        "--pipeline text`: random weights at the released shape, a small locally trained tokenizer.\n",
        encoding="utf-8",
    )
    return out


def init_experts(model: Any, *, generator: Any) -> None:
    """Seeded normal init of every fused expert tensor.

    transformers 5.23 initialises the thinker's experts but leaves the talker's
    (``Qwen3OmniMoeTalkerTextExperts``, built with ``torch.empty``) as whatever memory held, so
    the checkpoint would differ from run to run and could hold NaNs (``--load-format dummy``
    initialises its talker with this too).
    """
    import torch

    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("Experts"):
                for param in (module.gate_up_proj, module.down_proj):
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.02)


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
    import torch
    from transformers import GenerationConfig, Qwen3OmniMoeForConditionalGeneration
    from transformers.utils import logging as hf_logging

    step("training the BPE tokenizer")
    processor = build_processor(min_pixels=IMAGE_MIN_PIXELS, max_pixels=IMAGE_MAX_PIXELS)
    processor.save_pretrained(out)

    step("building the model with random weights")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the talker config names thinker-vocabulary ids, by design
    try:
        config = tiny_config(processor)
        torch.manual_seed(seed)
        model = Qwen3OmniMoeForConditionalGeneration(config).float().eval()
    finally:
        hf_logging.set_verbosity(verbosity)
    init_experts(model, generator=torch.Generator().manual_seed(seed + 1))
    ids = special_token_ids()
    model.generation_config = GenerationConfig(
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], pad_token_id=ids["<|endoftext|>"]
    )
    n_params = sum(p.numel() for p in model.parameters())
    step(f"saving {n_params / 1e6:.2f}M parameters")
    model.save_pretrained(out)
    (out / "README.md").write_text(
        README.format(
            version=TINY_FORMAT_VERSION,
            seed=seed,
            hidden=THINKER_HIDDEN,
            vocab=VOCAB_SIZE,
            groups=config.talker_config.num_code_groups,
        ),
        encoding="utf-8",
    )
    marker = {
        "format_version": TINY_FORMAT_VERSION,
        "family": "qwen3_omni_moe",
        "seed": seed,
        "random_weights": True,
    }
    (out / _MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    step(f"done: {out}")
    return out


def is_tiny_checkpoint(path: str | Path) -> bool:
    """True when ``path`` holds a complete tiny Qwen3-Omni-MoE checkpoint of the current format."""
    try:
        data = json.loads((Path(path) / _MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return data.get("format_version") == TINY_FORMAT_VERSION and data.get("family") == "qwen3_omni_moe"


def ensure_tiny_checkpoint(cache_dir: str | Path | None = None, *, progress: bool = True) -> Path:
    """Return ``<cache>/tiny-qwen3-omni-moe``, creating it once."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return ensure_checkpoint(
        root / CACHE_NAME,
        create=lambda staging: create_tiny_checkpoint(staging, progress=progress),
        is_ready=is_tiny_checkpoint,
    )
