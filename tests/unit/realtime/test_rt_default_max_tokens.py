"""A response that names no output budget gets the setting's, within the model's context."""

from __future__ import annotations

import pytest

from omni_runtime.realtime.settings import RealtimeSettings, default_max_tokens


@pytest.mark.parametrize(
    ("setting", "context", "expected"),
    [(1024, 8192, 1024), (1024, 512, 512), (1024, 1024, 1024), (64, 0, 1)],
)
def test_default_max_tokens(setting: int, context: int, expected: int) -> None:
    settings = RealtimeSettings(default_max_output_tokens=setting)
    assert default_max_tokens(settings, max_model_len=context) == expected
