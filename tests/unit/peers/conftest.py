"""Fixtures: the released peer runtimes, installed once per machine (see peer_runs.py)."""

from __future__ import annotations

import pytest
from peer_runs import SGLANG_OMNI, VLLM_OMNI, install


@pytest.fixture(scope="session")
def sglang_site() -> str:
    return str(install(*SGLANG_OMNI))


@pytest.fixture(scope="session")
def vllm_site() -> str:
    return str(install(*VLLM_OMNI))
