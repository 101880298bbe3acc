"""Chart tests need the real helm binary (tests/tools/install_k8s_tools.py); without it they skip."""

from __future__ import annotations

import pytest
from chart_tools import find_tool, missing_reason


@pytest.fixture
def helm_available() -> None:
    if find_tool("helm") is None:
        pytest.skip(missing_reason("helm"))
