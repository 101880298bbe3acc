"""The worker table: snapshots from a source merged with what the router observed."""

from __future__ import annotations

from omni_runtime.router.table import TableChange, WorkerSpec, WorkerState, WorkerTable


def test_a_snapshot_adds_changes_and_drops_workers(spec):
    table = WorkerTable()
    assert table.apply([spec("w0"), spec("w1")]) == TableChange(added=("w0", "w1"))
    change = table.apply([spec("w0", WorkerState.draining), spec("w2")])
    assert change == TableChange(added=("w2",), changed=("w0",), gone=("w1",), dropped=("w1",))
    assert [worker.id for worker in table.workers()] == ["w0", "w2"]
    assert table.get("w0").state is WorkerState.draining


def test_observed_state_survives_a_new_snapshot(spec):
    table = WorkerTable()
    table.apply([spec("w0")])
    table.set_health("w0", True)
    table.open_session("w0")
    table.apply([spec("w0", revision="r2")])
    worker = table.get("w0")
    assert (worker.healthy, worker.sessions, worker.spec.revision) == (True, 1, "r2")


def test_a_new_url_must_pass_ready_again(spec):
    table = WorkerTable()
    table.apply([spec("w0")])
    table.set_health("w0", True)
    table.apply([WorkerSpec(id="w0", url="http://elsewhere:8000", revision="r1")])
    assert table.get("w0").healthy is False


def test_a_removed_worker_with_live_sessions_stays_gone_until_idle(spec):
    table = WorkerTable()
    table.apply([spec("w0"), spec("w1")])
    table.open_session("w1")
    table.open_session("w1")
    assert table.apply([spec("w0")]) == TableChange(gone=("w1",))
    assert table.get("w1").state is WorkerState.gone
    assert table.get("w1").keeps_sessions is False
    assert table.close_session("w1") is False
    assert table.close_session("w1") is True  # the last session ended: the worker leaves
    assert table.get("w1") is None


def test_a_removed_worker_that_returns_is_restored(spec):
    table = WorkerTable()
    table.apply([spec("w0")])
    table.open_session("w0")
    table.apply([])
    assert table.apply([spec("w0")]) == TableChange(changed=("w0",))
    assert table.get("w0").state is WorkerState.ready


def test_effective_state_and_rotation(spec):
    table = WorkerTable()
    table.apply([spec("w0"), spec("w1", WorkerState.starting), spec("w2", WorkerState.gone)])
    for worker_id in ("w0", "w1", "w2"):
        table.set_health(worker_id, True)
    assert [w.id for w in table.in_rotation()] == ["w0"]
    table.drain("w0")
    table.drain("w1")
    states = {worker.id: worker.state for worker in table.workers()}
    assert states == {"w0": WorkerState.draining, "w1": WorkerState.draining, "w2": WorkerState.gone}
    assert table.in_rotation() == []
    table.undrain("w0")
    assert [w.id for w in table.in_rotation()] == ["w0"]


def test_health_changes_are_reported_once(spec):
    table = WorkerTable()
    table.apply([spec("w0")])
    assert table.set_health("w0", True) is True
    assert table.set_health("w0", True) is False
    assert table.set_health("w0", False) is True
    assert table.set_health("missing", True) is False


def test_capacity(spec):
    table = WorkerTable(max_sessions_per_worker=2)
    table.apply([spec("w0")])
    worker = table.get("w0")
    table.open_session("w0")
    assert table.has_capacity(worker) is True
    table.open_session("w0")
    assert table.has_capacity(worker) is False
    assert (worker.sessions, worker.assigned) == (2, 2)
    table.close_session("w0")
    assert (worker.sessions, worker.assigned, worker.idle) == (1, 2, False)


def test_a_probe_could_bring_in_only_a_ready_worker_failing_its_checks(spec):
    table = WorkerTable()
    assert table.could_join_on_a_probe() is False  # empty
    table.apply(
        [spec("w0", WorkerState.draining), spec("w1", WorkerState.starting), spec("w2", WorkerState.gone)]
    )
    assert table.could_join_on_a_probe() is False  # none the source calls ready
    table.apply([spec("w0", WorkerState.draining), spec("w3")])
    assert table.could_join_on_a_probe() is True  # w3: ready by its source, not yet passing /ready
    table.set_health("w3", True)
    assert table.could_join_on_a_probe() is False
