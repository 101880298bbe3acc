"""Builders for worker tables in exact states, shared by the router's unit tests (as fixtures)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from omni_runtime.router.table import WorkerSpec, WorkerState, WorkerTable

SpecFactory = Callable[..., WorkerSpec]
TableFactory = Callable[..., WorkerTable]


def _spec(worker_id: str, state: WorkerState = WorkerState.ready, *, revision: str = "r1") -> WorkerSpec:
    return WorkerSpec(id=worker_id, url=f"http://{worker_id}.test:8000", revision=revision, state=state)


def _table_of(
    *specs: WorkerSpec,
    healthy: tuple[str, ...] | None = None,
    sessions: dict[str, int] | None = None,
    assigned: dict[str, int] | None = None,
    max_sessions: int = 0,
) -> WorkerTable:
    """A table with the given workers; all healthy unless `healthy` names the healthy ones."""
    table = WorkerTable(max_sessions_per_worker=max_sessions)
    table.apply(specs)
    for worker in table.workers():
        worker.healthy = healthy is None or worker.id in healthy
        worker.sessions = (sessions or {}).get(worker.id, 0)
        worker.assigned = (assigned or {}).get(worker.id, worker.sessions)
    return table


@pytest.fixture
def spec() -> SpecFactory:
    return _spec


@pytest.fixture
def table_of() -> TableFactory:
    return _table_of


@pytest.fixture
def ready3() -> WorkerTable:
    return _table_of(_spec("w0"), _spec("w1"), _spec("w2"))
