"""`omni tiny-checkpoint DIR [--family F]`: write a model family's tiny random-weight checkpoint.

Each family's tiny module (models/<family>/tiny.py) knows its layout; this entry point picks one
by ``--family`` (the config.json ``model_type``: qwen2_5_omni, the default, or qwen3_omni_moe).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

FAMILIES = ("qwen2_5_omni", "qwen3_omni_moe")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="omni tiny-checkpoint",
        description="Write a small omni checkpoint with RANDOM weights (for tests and demos).",
    )
    parser.add_argument("dir", type=Path, help="directory to write (created)")
    parser.add_argument(
        "--family",
        choices=FAMILIES,
        default=FAMILIES[0],
        help="model family (config.json model_type) whose layout to write (default qwen2_5_omni)",
    )
    parser.add_argument(
        "--shape",
        choices=("tiny", "released"),
        default="tiny",
        help="'released' writes the released config (Qwen2.5-Omni-7B, Qwen3-Omni-30B-A3B) and the tokenizer "
        "with no weights, for omni serve --load-format dummy (default tiny)",
    )
    parser.add_argument("--force", action="store_true", help="replace DIR if it exists and is not empty")
    parser.add_argument("--seed", type=int, default=0, help="random seed for the weights (default 0)")
    parser.add_argument("--quiet", action="store_true", help="print no progress")
    args = parser.parse_args(argv)
    target: Path = args.dir
    if target.exists() and not target.is_dir():
        print(
            f"omni tiny-checkpoint: {target} exists and is not a directory; choose another DIR",
            file=sys.stderr,
        )
        return 2
    if target.is_dir() and any(target.iterdir()):
        if not args.force:
            print(
                f"omni tiny-checkpoint: {target} exists and is not empty; pass --force to replace it",
                file=sys.stderr,
            )
            return 2
        shutil.rmtree(target)
    if args.family == "qwen3_omni_moe":
        from omni_runtime.models.qwen3_omni_moe.tiny import create_released_shape, create_tiny_checkpoint
    else:
        from omni_runtime.models.qwen2_5_omni.released import create_released_shape  # type: ignore[assignment]
        from omni_runtime.models.qwen2_5_omni.tiny import create_tiny_checkpoint  # type: ignore[assignment]
    created = not target.exists()
    try:
        if args.shape == "released":
            print(create_released_shape(target))
            return 0
        create_tiny_checkpoint(target, seed=args.seed, progress=not args.quiet)
    except OSError as err:  # an unwritable or impossible DIR, a full disk: no half-written checkpoint
        if created:
            shutil.rmtree(target, ignore_errors=True)
        where = err.filename or target
        print(
            f"omni tiny-checkpoint: cannot write {where}: {err.strerror or err}; choose a DIR you can write",
            file=sys.stderr,
        )
        return 2
    print(target)
    return 0
