"""Choosing and loading the adapter for a checkpoint (by its config's ``model_type``).

Families: Qwen2.5-Omni (``qwen2_5_omni``) and Qwen3-Omni-MoE (``qwen3_omni_moe``).
"""

from __future__ import annotations

import json
from pathlib import Path

from omni_runtime.contract.adapter import OmniAdapter
from omni_runtime.contract.engine import EngineError
from omni_runtime.contract.options import EngineOptions

SUPPORTED = ("qwen2_5_omni", "qwen3_omni_moe")
PLANNED: dict[str, str] = {}


def resolve_model_path(options: EngineOptions) -> Path | None:
    """The checkpoint directory; None only for dummy weights with no directory (7B shape)."""
    if options.model_path:
        path = Path(options.model_path).expanduser()
        if not (path / "config.json").is_file():
            raise EngineError(
                f"model path {path} has no config.json; point --model-path at a checkpoint directory "
                "(or omit it to serve the tiny checkpoint)",
                param="model_path",
            )
        return path
    if options.load_format == "dummy":
        return None
    return ensure_tiny(options.tiny_family)


def ensure_tiny(family: str, *, progress: bool = False) -> Path:
    """The cached tiny random-weight checkpoint of ``family`` (a config.json model_type), made once."""
    if family == "qwen3_omni_moe":
        from omni_runtime.models.qwen3_omni_moe.tiny import ensure_tiny_checkpoint as ensure_qwen3

        return ensure_qwen3(progress=progress)
    if family != "qwen2_5_omni":
        raise EngineError(
            f"no tiny checkpoint for family {family!r}; choose one of {', '.join(SUPPORTED)}",
            param="tiny_family",
        )
    from omni_runtime.models.qwen2_5_omni.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint(progress=progress)


def model_type(path: Path | None) -> str:
    if path is None:
        return "qwen2_5_omni"
    try:
        return str(json.loads((path / "config.json").read_text(encoding="utf-8")).get("model_type", ""))
    except (OSError, ValueError) as exc:
        raise EngineError(f"cannot read {path / 'config.json'}: {exc}", param="model_path") from exc


def load_adapter(
    options: EngineOptions, *, hosted: frozenset[str], path: Path | None = None, tp_rank: int = 0
) -> OmniAdapter:
    """Load the modules for the ``hosted`` stages and wrap them in the family's adapter.

    ``path`` (default: from the options) and ``tp_rank`` > 0 for a thinker TP follower, which
    loads and keeps its shard of the thinker (entrypoints/tp_follower.py).
    """
    if path is None:
        path = resolve_model_path(options)
    kind = model_type(path)
    if kind == "qwen2_5_omni":
        from omni_runtime.models.qwen2_5_omni.adapter import Qwen25OmniAdapter
        from omni_runtime.models.qwen2_5_omni.loader import load_model

        return Qwen25OmniAdapter(
            load_model(options, path=path, hosted=hosted, tp_rank=tp_rank), options=options, hosted=hosted
        )
    if kind == "qwen3_omni_moe":
        from omni_runtime.models.qwen3_omni_moe.adapter import Qwen3OmniMoeAdapter
        from omni_runtime.models.qwen3_omni_moe.loader import load_model as load_qwen3

        assert path is not None  # model_type() names qwen2_5_omni for a dummy model without a directory
        return Qwen3OmniMoeAdapter(
            load_qwen3(options, path=path, hosted=hosted, tp_rank=tp_rank), options=options, hosted=hosted
        )
    if kind in PLANNED:
        raise EngineError(
            f"{PLANNED[kind]} ({kind}) is not supported by the builtin runtime yet; supported: {', '.join(SUPPORTED)}",
            param="model_path",
        )
    raise EngineError(f"unknown model type {kind!r}; supported: {', '.join(SUPPORTED)}", param="model_path")
