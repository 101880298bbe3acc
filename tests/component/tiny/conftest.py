"""One tiny checkpoint per test session: creation costs seconds, loading transformers more."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from omni_runtime.models.qwen2_5_omni.tiny import create_tiny_checkpoint

    return create_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", seed=0, progress=False)


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Path):
    from transformers import Qwen2_5OmniForConditionalGeneration

    return Qwen2_5OmniForConditionalGeneration.from_pretrained(tiny_dir, local_files_only=True).eval()


@pytest.fixture(scope="session")
def tiny_processor(tiny_dir: Path):
    from transformers import Qwen2_5OmniProcessor

    return Qwen2_5OmniProcessor.from_pretrained(tiny_dir, local_files_only=True)
