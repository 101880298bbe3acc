"""Fixtures for the kopf glue (handlers.py): its reconcile loop driven without kopf or an API server,
each pass scripted and the Kube object faked."""

from __future__ import annotations

import pytest

from omni_operator import handlers


@pytest.fixture
def quick_loop(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """No waiting between passes; returns the failure counts the loop asked retry_delay about."""
    asked: list[int] = []

    def no_delay(failures: int) -> float:
        asked.append(failures)
        return 0.0

    monkeypatch.setattr(handlers, "retry_delay", no_delay)
    monkeypatch.setattr(handlers.OPTIONS, "resync_seconds", 0.0)
    monkeypatch.setattr(handlers.OPTIONS, "debounce_seconds", 0.0)
    return asked
