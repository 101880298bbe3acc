"""Fixtures for reconcile table tests (builders live in reconcile_builders.py)."""

from __future__ import annotations

import pytest
from reconcile_builders import deployment_body, plan_of

from omni_operator.plan import Plan


@pytest.fixture
def plan2() -> Plan:
    """Qwen2.5-Omni-7B speech on H100, two workers: api + thinker (1 GPU) + talker (1 GPU) each."""
    return plan_of(deployment_body(workers=2))
