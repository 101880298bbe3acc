"""Qwen2.5-Omni-7B's released shape with no weights, for ``omni serve --load-format dummy``
(``omni tiny-checkpoint --shape released``): the GPU benchmarks serve the real model size with
random weights and no download."""

from __future__ import annotations

import shutil
from pathlib import Path

from omni_runtime.models.qwen2_5_omni import tiny
from omni_runtime.models.qwen2_5_omni.loader import load_processor, released_7b_config


def create_released_shape(path: str | Path) -> Path:
    """Write the released Qwen2.5-Omni-7B shape with no weights, for ``omni serve --load-format
    dummy``: the tiny checkpoint's tokenizer, processor and voices with the released config
    (``loader.released_7b_config``, special-token ids of that tokenizer) beside them."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    source = tiny.ensure_tiny_checkpoint(progress=False)
    shutil.copytree(
        source,
        out,
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns("model.safetensors", "config.json", "README.md", tiny.MARKER),
    )
    released_7b_config(load_processor(None)).save_pretrained(out)
    (out / "README.md").write_text(
        "# Qwen2.5-Omni-7B shape, no weights\n\nServe with `omni serve --model-path DIR --load-format dummy`: "
        "random weights at the released shape, a small locally trained tokenizer.\n",
        encoding="utf-8",
    )
    return out
