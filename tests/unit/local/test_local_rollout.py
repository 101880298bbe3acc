"""The local rollout decision: exact steps for each situation, and whole rollouts simulated tick by
tick so the sequence of worker states can be compared with the strategy."""

from __future__ import annotations

from dataclasses import replace

import pytest

from omni_operator.api.spec import RolloutSpec
from omni_operator.local.rollout import Desired, Status, Step, Stop, WorkerView, next_step
from omni_operator.rollout import WorkerState as Phase

OLD, NEW = "r-old", "r-new"


def w(
    index: int,
    revision: str = OLD,
    phase: Phase = Phase.ready,
    *,
    admitted: bool | None = None,
    sessions: int | None = 0,
    started_at: float = 0.0,
    draining_since: float | None = None,
    ever_admitted: bool | None = None,
) -> WorkerView:
    admitted = phase is Phase.ready if admitted is None else admitted
    return WorkerView(
        name=f"d-w{index}",
        index=index,
        revision=revision,
        phase=phase,
        admitted=admitted,
        ever_admitted=admitted if ever_admitted is None else ever_admitted,
        started_at=started_at,
        draining_since=draining_since
        if draining_since is not None
        else (0.0 if phase is Phase.draining else None),
        sessions=sessions,
    )


def want(revision: str = NEW, workers: int = 2, **strategy: object) -> Desired:
    return Desired(revision=revision, workers=workers, **strategy)  # type: ignore[arg-type]


def counts(new: int, total: int, available: int, old: int, draining: int, revision: str = NEW) -> str:
    return (
        f"{new}/{total} workers on revision {revision}, {available} available, {old} old, {draining} draining"
    )


CASES: list[tuple[str, list[WorkerView], Desired, float, Step]] = [
    (
        "first start: every worker at once",
        [],
        want(),
        0.0,
        Step(Status.progressing, counts(0, 2, 0, 0, 0), start=2),
    ),
    (
        "starting workers are waited for",
        [w(0, NEW, Phase.starting), w(1, NEW, Phase.starting)],
        want(),
        5.0,
        Step(Status.progressing, counts(2, 2, 0, 0, 0)),
    ),
    (
        "ready but not yet admitted by the router is not available",
        [w(0, NEW, Phase.ready, admitted=False), w(1, NEW)],
        want(),
        5.0,
        Step(Status.progressing, counts(2, 2, 1, 0, 0)),
    ),
    (
        "all admitted: complete",
        [w(0, NEW), w(1, NEW)],
        want(),
        5.0,
        Step(Status.complete, "2 workers on revision r-new, all available"),
    ),
    (
        "new revision, surge 1: one new worker, nothing drained yet",
        [w(0), w(1)],
        want(),
        0.0,
        Step(Status.progressing, counts(0, 2, 2, 2, 0), start=1),
    ),
    (
        "surge worker starting: wait, keep both old workers",
        [w(0), w(1), w(2, NEW, Phase.starting)],
        want(),
        3.0,
        Step(Status.progressing, counts(1, 2, 2, 2, 0)),
    ),
    (
        "surge worker admitted: drain the oldest old worker, start nothing (room is full)",
        [w(0), w(1), w(2, NEW)],
        want(),
        3.0,
        Step(Status.progressing, counts(1, 2, 3, 2, 0), drain=("d-w0",)),
    ),
    (
        "draining worker with live sessions is kept",
        [w(0, phase=Phase.draining, sessions=3, draining_since=10.0), w(1), w(2, NEW)],
        want(),
        20.0,
        Step(Status.progressing, counts(1, 2, 2, 1, 1)),
    ),
    (
        "draining worker idle: stop it; its room frees only once it is gone",
        [w(0, phase=Phase.draining, sessions=0), w(1), w(2, NEW)],
        want(),
        20.0,
        Step(Status.progressing, counts(1, 2, 2, 1, 1), stop=(Stop("d-w0", "idle"),)),
    ),
    (
        "drain timeout stops a worker that still has sessions",
        [w(0, phase=Phase.draining, sessions=2, draining_since=10.0), w(1), w(2, NEW)],
        want(drain_timeout_s=30.0),
        40.0,
        Step(
            Status.progressing,
            counts(1, 2, 2, 1, 1),
            stop=(Stop("d-w0", "drainTimeoutSeconds (30s) passed with 2 live sessions"),),
        ),
    ),
    (
        "unknown sessions (router unreachable) wait for the timeout",
        [w(0, phase=Phase.draining, sessions=None, draining_since=10.0), w(1), w(2, NEW)],
        want(drain_timeout_s=30.0),
        40.0,
        Step(
            Status.progressing,
            counts(1, 2, 2, 1, 1),
            stop=(Stop("d-w0", "drainTimeoutSeconds (30s) passed with unknown live sessions"),),
        ),
    ),
    (
        "old worker gone: start the second new one",
        [w(1), w(2, NEW)],
        want(),
        25.0,
        Step(Status.progressing, counts(1, 2, 2, 1, 0), start=1),
    ),
    (
        "surge 0, unavailable 1: drain first, start after",
        [w(0), w(1)],
        want(max_surge=0, max_unavailable=1),
        0.0,
        Step(Status.progressing, counts(0, 2, 2, 2, 0), drain=("d-w0",)),
    ),
    (
        "surge 0, unavailable 1: room after the stop",
        [w(1)],
        want(max_surge=0, max_unavailable=1),
        5.0,
        Step(Status.progressing, counts(0, 2, 1, 1, 0), start=1),
    ),
    (
        "surge 2: both new workers at once, old ones drained together once both are admitted",
        [w(0), w(1), w(2, NEW), w(3, NEW)],
        want(max_surge=2),
        5.0,
        Step(Status.progressing, counts(2, 2, 4, 2, 0), drain=("d-w0", "d-w1")),
    ),
    (
        "old worker crashed (not available) is drained at no cost",
        [w(0, phase=Phase.starting, ever_admitted=True), w(1), w(2, NEW, Phase.starting, started_at=1.0)],
        want(),
        3.0,
        Step(Status.progressing, counts(1, 2, 1, 2, 0), drain=("d-w0",)),
    ),
    (
        "progress deadline: a new worker never admitted stops the rollout",
        [w(0), w(1), w(2, NEW, Phase.starting, started_at=100.0)],
        want(progress_deadline_s=60.0),
        160.0,
        Step(
            Status.deadline_exceeded,
            "d-w2 (revision r-new) was not ready within progressDeadlineSeconds (60s): no more workers "
            "are replaced and 2 old workers keep serving; fix the spec and run `omni up -f` again",
        ),
    ),
    (
        "progress deadline not yet passed",
        [w(0), w(1), w(2, NEW, Phase.starting, started_at=100.0)],
        want(progress_deadline_s=60.0),
        159.0,
        Step(Status.progressing, counts(1, 2, 2, 2, 0)),
    ),
    (
        "a new worker that was admitted once and then crashed is no deadline matter",
        [w(1), w(2, NEW, Phase.starting, started_at=0.0, ever_admitted=True)],
        want(progress_deadline_s=60.0),
        500.0,
        Step(Status.progressing, counts(1, 2, 1, 1, 0), start=1),
    ),
    (
        "paused mid-rollout: hold, but finish a drain already begun",
        [w(0, phase=Phase.draining, sessions=0), w(1), w(2, NEW)],
        want(paused=True),
        5.0,
        Step(
            Status.paused,
            "held by rollout.paused: " + counts(1, 2, 2, 1, 1),
            stop=(Stop("d-w0", "idle"),),
        ),
    ),
    (
        "paused with every worker on the revision: scaling still applies",
        [w(0, NEW), w(1, NEW)],
        want(workers=3, paused=True),
        5.0,
        Step(Status.progressing, counts(2, 3, 2, 0, 0), start=1),
    ),
    (
        "scale down: the highest index goes, no availability rule",
        [w(0, NEW), w(1, NEW), w(2, NEW)],
        want(workers=1),
        5.0,
        Step(Status.progressing, counts(3, 1, 3, 0, 0), drain=("d-w1", "d-w2")),
    ),
    (
        "scale down prefers a worker that is not available",
        [w(0, NEW), w(1, NEW, Phase.starting), w(2, NEW)],
        want(workers=2),
        5.0,
        Step(Status.progressing, counts(3, 2, 2, 0, 0), drain=("d-w1",)),
    ),
    (
        "scale to zero",
        [w(0, NEW), w(1, NEW)],
        want(workers=0),
        5.0,
        Step(Status.progressing, counts(2, 0, 2, 0, 0), drain=("d-w0", "d-w1")),
    ),
    (
        "revert mid-rollout: the old revision is wanted again, maxUnavailable 0 still holds",
        [w(0, NEW, Phase.draining, sessions=1), w(1, NEW), w(2, OLD)],
        want(revision=NEW),
        5.0,
        Step(Status.progressing, counts(1, 2, 2, 1, 1)),
    ),
    (
        "revert: the reverted-to workers count as new, the other revision drains once room allows",
        [w(1, OLD), w(2, NEW), w(3, OLD)],
        want(revision=OLD),
        5.0,
        Step(Status.progressing, counts(2, 2, 3, 1, 0, revision=OLD), drain=("d-w2",)),
    ),
    (
        "capacity (GPUs) leaves no room to surge and maxUnavailable is 0: blocked",
        [w(0), w(1)],
        want(capacity=2),
        0.0,
        Step(
            Status.blocked,
            "no room for a new worker: this machine holds 2 workers at once and 2 exist ("
            + counts(0, 2, 2, 2, 0)
            + "); set rollout.maxUnavailable: 1 so an old worker is drained first",
        ),
    ),
    (
        "capacity with maxUnavailable 1 replaces in place",
        [w(0), w(1)],
        want(capacity=2, max_unavailable=1),
        0.0,
        Step(Status.progressing, counts(0, 2, 2, 2, 0), drain=("d-w0",)),
    ),
]


@pytest.mark.parametrize(
    ("workers", "desired", "now", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_next_step(workers: list[WorkerView], desired: Desired, now: float, expected: Step) -> None:
    assert next_step(workers, desired, now=now) == expected


def test_desired_from_spec_defaults() -> None:
    assert Desired.of(revision="r", workers=3, rollout=RolloutSpec(), capacity=None) == Desired(
        revision="r",
        workers=3,
        max_surge=1,
        max_unavailable=0,
        drain_timeout_s=600.0,
        progress_deadline_s=600.0,
        paused=False,
        capacity=None,
    )


def simulate(workers: list[WorkerView], desired: Desired, *, ticks: int = 40) -> list[str]:
    """Drive the decision like the supervisor does: a started worker is admitted on the next tick,
    a drained one is idle on the next tick. Returns one line per tick that changed something."""
    trace: list[str] = []
    next_index = max((x.index for x in workers), default=-1) + 1
    min_available = desired.workers - desired.max_unavailable
    for tick in range(ticks):
        now = float(tick)
        step = next_step(workers, desired, now=now)
        available = sum(x.admitted for x in workers if x.phase is not Phase.draining)
        if step.status is Status.complete:
            trace.append("complete")
            return trace
        gone = {s.name for s in step.stop}
        updated: list[WorkerView] = []
        for x in workers:
            if x.name in gone:
                continue
            if x.name in step.drain:
                x = replace(x, phase=Phase.draining, admitted=False, draining_since=now, sessions=1)
            elif x.phase is Phase.draining:
                x = replace(x, sessions=0)
            elif x.phase is Phase.starting:
                x = replace(x, phase=Phase.ready, admitted=True, ever_admitted=True)
            updated.append(x)
        for _ in range(step.start):
            updated.append(w(next_index, desired.revision, Phase.starting, started_at=now))
            next_index += 1
        # Never more workers than workers + maxSurge; drains never take availability below the
        # floor (workers - maxUnavailable) or below where it already was.
        assert len(updated) <= desired.workers + desired.max_surge
        drained = sum(x.admitted for x in workers if x.name in step.drain)
        assert available - drained >= min(min_available, available)
        workers = updated
        trace.append(
            " ".join(
                f"{x.index}{'n' if x.revision == desired.revision else 'o'}:{x.phase.value}" for x in workers
            )
        )
    raise AssertionError(f"no completion in {ticks} ticks: {trace}")


def test_simulated_rollout_surge_one() -> None:
    assert simulate([w(0), w(1)], want()) == [
        "0o:ready 1o:ready 2n:starting",
        "0o:ready 1o:ready 2n:ready",
        "0o:draining 1o:ready 2n:ready",
        "0o:draining 1o:ready 2n:ready",
        "1o:ready 2n:ready",
        "1o:ready 2n:ready 3n:starting",
        "1o:ready 2n:ready 3n:ready",
        "1o:draining 2n:ready 3n:ready",
        "1o:draining 2n:ready 3n:ready",
        "2n:ready 3n:ready",
        "complete",
    ]


def test_simulated_rollout_unavailable_one() -> None:
    assert simulate([w(0), w(1)], want(max_surge=0, max_unavailable=1)) == [
        "0o:draining 1o:ready",
        "0o:draining 1o:ready",
        "1o:ready",
        "1o:ready 2n:starting",
        "1o:ready 2n:ready",
        "1o:draining 2n:ready",
        "1o:draining 2n:ready",
        "2n:ready",
        "2n:ready 3n:starting",
        "2n:ready 3n:ready",
        "complete",
    ]


def test_simulated_rollout_three_workers_surge_and_unavailable() -> None:
    assert simulate([w(0), w(1), w(2)], want(workers=3, max_surge=1, max_unavailable=1)) == [
        "0o:draining 1o:ready 2o:ready 3n:starting",
        "0o:draining 1o:ready 2o:ready 3n:ready",
        "1o:draining 2o:ready 3n:ready",
        "1o:draining 2o:ready 3n:ready 4n:starting",
        "2o:ready 3n:ready 4n:ready",
        "2o:draining 3n:ready 4n:ready 5n:starting",
        "2o:draining 3n:ready 4n:ready 5n:ready",
        "3n:ready 4n:ready 5n:ready",
        "complete",
    ]
