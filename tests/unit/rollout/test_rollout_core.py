"""One scenario table for the rollout core and both modes that count with it.

Each scenario is a set of workers (index, old or new revision, state, live sessions, how long ago it
started or began draining) and a spec; the expected outcome is what every decision must do now:
start N workers, let these workers go (begin draining them, or remove one that never served), end
these drains, or stop at the progress deadline. The same row runs against `count` (the core), local
mode's `next_step` and Kubernetes mode's `step_rollout`, each through a small adapter.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from omni_operator.local.rollout import Desired, Status, next_step
from omni_operator.reconcile.rollout import ObservedWorker, step_rollout
from omni_operator.rollout import Strategy, WorkerState, WorkerView, count, order, scale_down

OLD, NEW = "r0", "r1"
NOW_S = 10_000.0
NOW = dt.datetime.fromtimestamp(NOW_S, tz=dt.UTC)
DRAIN_TIMEOUT, DEADLINE = 60, 300


@dataclass(frozen=True)
class W:
    """A worker in a scenario: `state` is ready (available), starting or draining."""

    index: int
    revision: str = NEW
    state: WorkerState = WorkerState.ready
    sessions: int | None = 0
    age: float = 3600.0  # seconds since it started (the progress-deadline clock)
    draining_for: float = 0.0


@dataclass(frozen=True)
class Spec:
    workers: int = 2
    max_surge: int = 1
    max_unavailable: int = 0
    paused: bool = False


@dataclass(frozen=True)
class Outcome:
    start: int = 0
    leave: tuple[int, ...] = ()  # workers drained now, or removed at once when they never served
    done: tuple[int, ...] = ()  # drains that end now
    stuck: bool = False  # the progress deadline stopped the rollout


def o(i: int, state: WorkerState = WorkerState.ready, **kw: object) -> W:
    return W(i, OLD, state, **kw)  # type: ignore[arg-type]


def n(i: int, state: WorkerState = WorkerState.ready, **kw: object) -> W:
    return W(i, NEW, state, **kw)  # type: ignore[arg-type]


def draining(i: int, revision: str = OLD, **kw: object) -> W:
    return W(i, revision, WorkerState.draining, **kw)  # type: ignore[arg-type]


STARTING = WorkerState.starting
SCENARIOS: list[tuple[str, list[W], Spec, Outcome]] = [
    ("start from zero", [], Spec(), Outcome(start=2)),
    ("steady: nothing to do", [n(0), n(1)], Spec(), Outcome()),
    ("new revision: surge one worker", [o(0), o(1)], Spec(), Outcome(start=1)),
    ("surge limit: the surge worker is waited for", [o(0), o(1), n(2, STARTING, age=10)], Spec(), Outcome()),
    ("surge 2 starts two", [o(0), o(1)], Spec(max_surge=2), Outcome(start=2)),
    ("availability floor: one old worker drains", [o(0), o(1), n(2)], Spec(), Outcome(leave=(0,))),
    (
        "availability floor with maxUnavailable 1, no surge: drain first",
        [o(0), o(1)],
        Spec(max_surge=0, max_unavailable=1),
        Outcome(leave=(0,)),
    ),
    (
        "an old worker that is not available goes at no cost",
        [o(0, STARTING), o(1), n(2, STARTING, age=3)],
        Spec(),
        Outcome(leave=(0,)),
    ),
    (
        "a drain with live sessions goes on",
        [draining(0, sessions=3, draining_for=10), o(1), n(2)],
        Spec(),
        Outcome(),
    ),
    ("a drain finishes at 0 sessions", [draining(0, sessions=0), o(1), n(2)], Spec(), Outcome(done=(0,))),
    (
        "a drain times out with sessions left",
        [draining(0, sessions=2, draining_for=DRAIN_TIMEOUT), o(1), n(2)],
        Spec(),
        Outcome(done=(0,)),
    ),
    (
        "unknown sessions wait for the timeout",
        [draining(0, sessions=None, draining_for=DRAIN_TIMEOUT - 1), o(1), n(2)],
        Spec(),
        Outcome(),
    ),
    (
        "progress deadline: a new worker never ready stops the rollout",
        [o(0), o(1), n(2, STARTING, age=DEADLINE)],
        Spec(),
        Outcome(stuck=True),
    ),
    (
        "progress deadline not yet reached",
        [o(0), o(1), n(2, STARTING, age=DEADLINE - 1)],
        Spec(),
        Outcome(),
    ),
    ("paused: nothing begins", [o(0), o(1), n(2)], Spec(paused=True), Outcome()),
    (
        "paused: a drain under way still ends",
        [draining(0, sessions=0), o(1), n(2)],
        Spec(paused=True),
        Outcome(done=(0,)),
    ),
    ("scale up", [n(0), n(1)], Spec(workers=4), Outcome(start=2)),
    (
        "scale down: the fewest live sessions go, the highest index first among equals",
        [n(0, sessions=4), n(1, sessions=1), n(2, sessions=2), n(3, sessions=1)],
        Spec(),
        Outcome(leave=(1, 3)),
    ),
    (
        "scale down: a worker that is not available goes first",
        [n(0), n(1, STARTING, age=5), n(2)],
        Spec(),
        Outcome(leave=(1,)),
    ),
    (
        "scale down ignores maxUnavailable",
        [n(0), n(1), n(2)],
        Spec(workers=1, max_unavailable=0),
        Outcome(leave=(1, 2)),
    ),
    ("scale to zero", [n(0), n(1)], Spec(workers=0), Outcome(leave=(0, 1))),
    (
        "rollout with scale up: surge counts from the new size",
        [o(0), o(1)],
        Spec(workers=3),
        Outcome(start=2),
    ),
    (
        "rollout with scale down: the floor counts from the new size",
        [o(0), o(1), o(2), n(3)],
        Spec(),
        Outcome(leave=(0, 1)),
    ),
]


def strategy(spec: Spec) -> Strategy:
    return Strategy(
        max_surge=spec.max_surge,
        max_unavailable=spec.max_unavailable,
        drain_timeout_seconds=DRAIN_TIMEOUT,
        progress_deadline_seconds=DEADLINE,
        paused=spec.paused,
    )


def view(w: W) -> WorkerView:
    """The core's view, which local mode observes directly."""
    available = w.state is WorkerState.ready
    return WorkerView(
        name=f"d-w{w.index}",
        index=w.index,
        revision=w.revision,
        phase=w.state,
        admitted=available,
        ever_admitted=available,
        started_at=NOW_S - w.age,
        draining_since=NOW_S - w.draining_for if w.state is WorkerState.draining else None,
        sessions=w.sessions,
    )


def observed(w: W) -> ObservedWorker:
    """Kubernetes mode's observation: an old worker has a stale talker pod; ready workers published ready."""
    name = f"d-w{w.index}"
    ago = dt.timedelta(seconds=w.draining_for)
    return ObservedWorker(
        name=name,
        index=w.index,
        revision=w.revision,
        stale_pods=(f"{name}-talker",) if w.revision == OLD else (),
        ready=w.state is not WorkerState.starting,
        published=w.state,
        drain_started=NOW - ago if w.state is WorkerState.draining else None,
        sessions=w.sessions,
        since=NOW - dt.timedelta(seconds=w.age),
    )


def index(name: str) -> int:
    return int(name.removeprefix("d-w"))


def by_core(workers: list[W], spec: Spec) -> Outcome:
    c = count(
        [view(w) for w in workers], revision=NEW, desired=spec.workers, strategy=strategy(spec), now=NOW_S
    )
    return Outcome(
        start=c.start,
        leave=tuple(w.index for w in c.drain if w.index is not None),
        done=tuple(index(s.name) for s in c.stops),
        stuck=bool(c.stalled),
    )


def by_local(workers: list[W], spec: Spec) -> Outcome:
    s = strategy(spec)
    desired = Desired(
        revision=NEW,
        workers=spec.workers,
        max_surge=s.max_surge,
        max_unavailable=s.max_unavailable,
        drain_timeout_s=s.drain_timeout_seconds,
        progress_deadline_s=s.progress_deadline_seconds,
        paused=s.paused,
    )
    step = next_step([view(w) for w in workers], desired, now=NOW_S)
    return Outcome(
        start=step.start,
        leave=tuple(map(index, step.drain)),
        done=tuple(index(s.name) for s in step.stop),
        stuck=step.status is Status.deadline_exceeded,
    )


def by_kubernetes(workers: list[W], spec: Spec) -> Outcome:
    step = step_rollout(
        workers=[observed(w) for w in workers],
        desired=spec.workers,
        revision=NEW,
        strategy=strategy(spec),
        now=NOW,
        name_of=lambda i: f"d-w{i}",
    )
    was_draining = {f"d-w{w.index}" for w in workers if w.state is WorkerState.draining}
    ended = [*step.update, *step.delete]
    return Outcome(
        start=len(step.create),
        leave=tuple(sorted(map(index, [*step.drain, *(x for x in ended if x not in was_draining)]))),
        done=tuple(sorted(index(x) for x in ended if x in was_draining)),
        stuck=step.stuck is not None,
    )


DECIDERS: dict[str, Callable[[list[W], Spec], Outcome]] = {
    "core": by_core,
    "local": by_local,
    "kubernetes": by_kubernetes,
}


@pytest.mark.parametrize("mode", DECIDERS)
@pytest.mark.parametrize(
    ("workers", "spec", "expected"), [s[1:] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS]
)
def test_scenario(mode: str, workers: list[W], spec: Spec, expected: Outcome) -> None:
    assert DECIDERS[mode](workers, spec) == expected


@pytest.mark.parametrize(
    ("workers", "keep", "expected"),
    [
        ([n(0), n(1), n(2)], 3, []),
        ([n(0), n(1), n(2)], 1, [2, 1]),
        ([n(0, sessions=5), n(1, sessions=0), n(2, sessions=None)], 2, [1]),
        ([n(0, sessions=5), n(1, sessions=None), n(2, sessions=7)], 2, [0]),  # unknown counts as most
        ([n(0), n(1, STARTING), n(2, sessions=9)], 1, [1, 0]),
        ([draining(0, NEW, sessions=9), n(1, STARTING), n(2)], 2, [0]),  # already draining goes first
    ],
)
def test_scale_down_order(workers: list[W], keep: int, expected: list[int]) -> None:
    assert [w.index for w in scale_down([view(w) for w in workers], keep=keep)] == expected


def test_order_puts_names_outside_the_scheme_last() -> None:
    stray = WorkerView(name="d-extra", index=None, revision=OLD, phase=WorkerState.ready)
    assert sorted([stray, view(n(3)), view(n(1))], key=order) == [view(n(1)), view(n(3)), stray]
