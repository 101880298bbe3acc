"""Shared test settings: one cache directory for the tiny checkpoint across the whole run."""

from __future__ import annotations

import os
from pathlib import Path

# The tiny checkpoint is written once per machine outside the repo and reused by every tier.
os.environ.setdefault("OMNI_CACHE_DIR", str(Path.home() / ".cache" / "omni"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_sessionfinish(session, exitstatus) -> None:
    """Apps built inside the test process time its collections and warn on long ones; the long
    full collections of the interpreter's own teardown are no news."""
    import sys

    gc_pauses = sys.modules.get("omni_runtime.support.gc_pauses")
    if gc_pauses is not None:
        gc_pauses.watch_gc(warn_above_s=float("inf"))
