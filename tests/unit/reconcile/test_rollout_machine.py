"""step_rollout: exact next steps for the situations a rollout meets (table tests, no cluster).

Workers are written as compact views: `old(0)` is a serving worker of revision "r0" whose talker pod
differs from the update revision "r1"; `new(3)` a serving worker already at "r1".
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from omni_operator.api.status import WorkerState, WorkerStatus
from omni_operator.reconcile.rollout import ObservedWorker as WorkerView
from omni_operator.reconcile.rollout import RolloutStep, Strategy, step_rollout

NOW = dt.datetime(2026, 1, 1, 0, 10, tzinfo=dt.UTC)
R0, R1 = "r0", "r1"
READY, STARTING, DRAINING, GONE = (
    WorkerState.ready,
    WorkerState.starting,
    WorkerState.draining,
    WorkerState.gone,
)


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


def name(i: int) -> str:
    return f"q-w{i}"


def old(i: int, **kw: Any) -> WorkerView:
    base: dict[str, Any] = {"revision": R0, "stale_pods": (f"{name(i)}-talker",), "since": ago(3600)}
    return WorkerView(**({"name": name(i), "index": i, "ready": True, "published": READY} | base | kw))


def new(i: int, **kw: Any) -> WorkerView:
    base: dict[str, Any] = {"revision": R1, "since": ago(60)}
    return WorkerView(**({"name": name(i), "index": i, "ready": True, "published": READY} | base | kw))


def draining(i: int, *, started: float, sessions: int | None = None) -> WorkerView:
    return old(i, published=DRAINING, drain_started=ago(started), sessions=sessions)


def step(workers: list[WorkerView], desired: int = 3, **strategy: object) -> RolloutStep:
    defaults: dict[str, object] = {"drain_timeout_seconds": 60, "progress_deadline_seconds": 300}
    return step_rollout(
        workers=workers,
        desired=desired,
        revision=R1,
        strategy=Strategy(**(defaults | strategy)),  # type: ignore[arg-type]
        now=NOW,
        name_of=name,
    )


def table(*entries: tuple[int, str, WorkerState]) -> tuple[WorkerStatus, ...]:
    return tuple(WorkerStatus(name=name(i), revision=rev, state=state) for i, rev, state in entries)


def test_steady_state_keeps_every_worker_and_does_nothing() -> None:
    assert step([new(0), new(1), new(2)]) == RolloutStep(
        keep=(0, 1, 2), workers=table((0, R1, READY), (1, R1, READY), (2, R1, READY))
    )


def test_a_new_revision_surges_one_worker_and_drains_nothing_yet() -> None:
    assert step([old(0), old(1), old(2)]) == RolloutStep(
        keep=(3,),
        create=(3,),
        hold=(name(0), name(1), name(2)),
        workers=table((0, R0, READY), (1, R0, READY), (2, R0, READY), (3, R1, STARTING)),
    )


def test_a_ready_new_worker_is_not_counted_until_the_router_was_told() -> None:
    s = step([old(0), old(1), old(2), new(3, published=STARTING)])
    assert (s.create, s.drain, s.publish) == ((), (), ())
    assert s.workers[-1] == WorkerStatus(name=name(3), revision=R1, state=READY)


def test_once_the_new_worker_is_admitted_the_lowest_old_one_drains() -> None:
    assert step([old(0), old(1), old(2), new(3)]) == RolloutStep(
        keep=(3,),
        drain=(name(0),),
        hold=(name(0), name(1), name(2)),
        publish=((name(0), DRAINING),),
        workers=table((0, R0, DRAINING), (1, R0, READY), (2, R0, READY), (3, R1, READY)),
        requeue_after=61.0,
    )


def test_a_drain_waits_for_its_deadline() -> None:
    s = step([draining(0, started=20), old(1), old(2), new(3)])
    assert (s.update, s.delete, s.drain, s.create) == ((), (), (), ())
    assert s.hold == (name(1), name(2), name(0))
    assert s.requeue_after == 41.0


def test_a_drained_worker_is_updated_in_place_while_new_workers_are_short() -> None:
    assert step([draining(0, started=60), old(1), old(2), new(3)]) == RolloutStep(
        keep=(0, 3),
        update=(name(0),),
        update_pods=(f"{name(0)}-talker",),
        hold=(name(1), name(2)),
        workers=table((0, R1, STARTING), (1, R0, READY), (2, R0, READY), (3, R1, READY)),
    )


@pytest.mark.parametrize(("sessions", "updated"), [(0, (name(0),)), (2, ()), (None, ())])
def test_router_reports_end_a_drain_early_only_at_zero(sessions: int | None, updated: tuple) -> None:
    assert step([draining(0, started=5, sessions=sessions), old(1), old(2), new(3)]).update == updated


def test_the_last_drained_worker_is_deleted_not_updated() -> None:
    assert step([new(0), new(1), draining(2, started=61), new(3)]) == RolloutStep(
        keep=(0, 1, 3),
        delete=(name(2),),
        workers=table((0, R1, READY), (1, R1, READY), (2, R0, GONE), (3, R1, READY)),
    )


def test_max_unavailable_drains_without_surge() -> None:
    s = step([old(0), old(1), old(2)], max_surge=0, max_unavailable=1)
    assert (s.create, s.drain) == ((), (name(0),))


def test_max_surge_two_creates_two_then_drains_two() -> None:
    assert step([old(0), old(1), old(2)], max_surge=2).create == (3, 4)
    s = step([old(0), old(1), old(2), new(3), new(4)], max_surge=2)
    assert s.drain == (name(0), name(1))


def test_never_more_than_workers_plus_surge_terminating_ones_included() -> None:
    going = WorkerView(name=name(0), index=0, revision=R0, terminating=True)
    s = step([going, old(1), old(2), new(3)], max_surge=1)
    assert (s.create, s.keep) == ((), (3,))
    assert s.workers[0] == WorkerStatus(name=name(0), revision=R0, state=GONE)


def test_new_indexes_never_reuse_a_name_that_still_exists() -> None:
    going = WorkerView(name=name(1), index=1, revision=R0, terminating=True)
    s = step([new(0), going], desired=3, max_surge=2)
    assert s.create == (2, 3)


def test_old_workers_that_never_served_are_replaced_without_a_drain() -> None:
    s = step([old(0, published=STARTING, ready=False), old(1), old(2)], max_surge=1)
    assert (s.update, s.update_pods, s.create) == ((name(0),), (f"{name(0)}-talker",), (3,))
    full = step([new(0), new(1), new(2), old(3, published=STARTING, ready=False)])
    assert (full.update, full.delete) == ((), (name(3),))


def test_a_serving_old_worker_whose_pods_fail_is_announced_starting() -> None:
    s = step([old(0, ready=False), old(1), old(2), new(3)])
    assert s.publish == ((name(0), STARTING),)
    assert s.drain == ()  # w1 cannot drain either: w0 no longer serves, so only 3 do


def test_revert_restores_a_draining_worker_of_the_target_revision() -> None:
    # Spec went back to r1 while w0 (r1) was draining and w3 (r0, surged) serves.
    back = WorkerView(
        name=name(0), index=0, revision=R1, ready=True, published=DRAINING, drain_started=ago(5)
    )
    s = step([back, new(1), new(2), old(3)])
    assert s.undrain == (name(0),)
    assert (s.drain, s.delete, s.create) == ((), (), ())  # w0 is not yet serving again
    assert s.workers[0] == WorkerStatus(name=name(0), revision=R1, state=READY)
    later = step([new(0), new(1), new(2), old(3)])
    assert later.drain == (name(3),)


def test_revert_replaces_a_starting_new_worker_at_once() -> None:
    s = step([new(0), new(1), new(2), old(3, published=STARTING, ready=False)])
    assert s.delete == (name(3),)


def test_paused_starts_nothing_but_finishes_a_drain_and_still_scales_up() -> None:
    s = step([draining(0, started=61), old(1), old(2), new(3)], paused=True)
    assert (s.update, s.drain, s.create, s.paused) == ((name(0),), (), (), True)
    assert step([old(0), old(1), old(2)], paused=True).create == ()
    assert step([new(0)], paused=True).create == (1, 2)
    assert step([new(0), new(1), new(2)], paused=True).paused is False  # nothing left to do


def test_progress_deadline_stops_new_steps() -> None:
    late = new(4, ready=False, published=STARTING, since=ago(301))
    s = step([old(0), old(1), old(2), new(3), late], max_surge=2)
    assert s.stuck == (
        "worker q-w4 not ready 300 s after its pods were created (revision r1); no more workers are replaced"
    )
    assert (s.drain, s.create) == ((), ())  # without the deadline w0 would drain (4 serve, 3 needed)
    assert step([old(0), old(1), old(2), new(3), new(4, ready=False, since=ago(200))], max_surge=2).drain == (
        name(0),
    )


def test_deadline_wakeup_and_pause_stops_the_clock() -> None:
    starting = new(3, ready=False, published=STARTING, since=ago(100))
    assert step([old(0), old(1), old(2), starting]).requeue_after == 201.0
    late = new(3, ready=False, published=STARTING, since=ago(900))
    assert step([old(0), old(1), old(2), late], paused=True).stuck is None


def test_scale_down_deletes_a_not_ready_worker_and_drains_the_highest_index() -> None:
    s = step([new(0), new(1, ready=False, published=STARTING), new(2), new(3)], desired=2)
    assert s.delete == (name(1),)  # never published ready: no sessions to wait for
    assert (s.drain, s.publish, s.hold) == ((name(3),), ((name(3), DRAINING),), (name(3),))
    assert s.keep == (0, 2)
    going = step([new(0), new(2), new(3, published=DRAINING, drain_started=ago(30), sessions=2)], desired=2)
    assert (going.hold, going.undrain, going.delete) == ((name(3),), (), ())  # it stays draining
    drained = new(3, published=DRAINING, drain_started=ago(30), sessions=0)
    assert step([new(0), new(2), drained], desired=2).delete == (name(3),)


def test_workers_named_outside_the_scheme_are_deleted_not_updated() -> None:
    stray = WorkerView(name="q-extra", index=None, revision=R0, published=STARTING, stale_pods=("x",))
    s = step([new(0), new(1), stray])
    assert (s.delete, s.create) == (("q-extra",), (2,))


def test_zero_workers_drains_everything_old() -> None:
    s = step([old(0), old(1)], desired=0)
    assert s.drain == (name(0), name(1))
    assert s.create == ()
