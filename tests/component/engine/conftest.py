"""Fixtures: the tiny checkpoints (both families) and module-scoped streaming-speech engines on the CPU."""

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


@pytest.fixture(scope="session")
def qwen3_checkpoint() -> Path:
    from omni_runtime.models.qwen3_omni_moe.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint(progress=False)


@pytest.fixture(scope="module")
def hf_qwen3(qwen3_checkpoint: Path):
    """transformers' own Qwen3OmniMoeForConditionalGeneration on the tiny checkpoint: the reference."""
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from omni_runtime.models.qwen3_omni_moe.config import ensure_talker_fields
    from omni_runtime.models.qwen3_omni_moe.loader import use_experts

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(qwen3_checkpoint), dtype=torch.float32)
    use_experts(model, "eager")  # transformers' plain per-expert loop, thinker and talker
    # transformers 5.23's talker rope indexing reads an audio config its config lacks (see
    # qwen3_omni_moe/config.py): without it generate raises on audio with an image or video.
    ensure_talker_fields(model.config)
    return model.eval()


@pytest.fixture(scope="module")
def qwen3_speech_engine(qwen3_checkpoint: Path) -> Iterator[Harness]:
    harness = Harness(tiny_options(qwen3_checkpoint))
    yield harness
    harness.close()


@pytest.fixture(params=["qwen2_5_omni", "qwen3_omni_moe"])
def family_speech_engine(request: pytest.FixtureRequest) -> Harness:
    """The streaming-speech engine of each model family in turn (its module-scoped fixture)."""
    name = "speech_engine" if request.param == "qwen2_5_omni" else "qwen3_speech_engine"
    return request.getfixturevalue(name)
