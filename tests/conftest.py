"""Shared test settings: one cache directory for the tiny checkpoint across the whole run."""

from __future__ import annotations

import os
from pathlib import Path

# The tiny checkpoint is written once per machine outside the repo and reused by every tier.
os.environ.setdefault("OMNI_CACHE_DIR", str(Path.home() / ".cache" / "omni"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
