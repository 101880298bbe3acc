"""Fixtures: the tiny checkpoint and a module-scoped streaming-speech engine on the CPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_harness import Harness, tiny_options


@pytest.fixture(scope="session")
def tiny_checkpoint() -> Path:
    from omni_runtime.models.qwen2_5_omni.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint(progress=False)


@pytest.fixture(scope="module")
def speech_engine(tiny_checkpoint: Path) -> Iterator[Harness]:
    harness = Harness(tiny_options(tiny_checkpoint))
    yield harness
    harness.close()
