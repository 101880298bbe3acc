"""The counting rules of a rolling upgrade, decided once for both modes.

Local mode (`omni up`, local/rollout.py) observes processes and the router; Kubernetes mode
(reconcile/rollout.py) observes pods and Services. Both reduce each worker to a `WorkerView` and
count with the rules here, so they cannot disagree on them. The rules are a Deployment's, counted
in whole workers (spec.rollout):

- surge ceiling: at most `workers + maxSurge` workers exist at once, draining and terminating ones
  included (they still hold sessions, ports and GPUs), and never more than the machine holds
  (`capacity`, local mode with GPUs);
- availability floor: a drain never leaves fewer than `workers - maxUnavailable` workers available;
  a worker that is not available serves nothing new, so draining it costs nothing;
- drain completion: a draining worker is done once its live sessions reach 0, or once
  `drainTimeoutSeconds` passed since its drain began (unknown sessions wait for the timeout);
- progress deadline: a worker of the desired revision not available `progressDeadlineSeconds` after
  its clock started stops the rollout: no new surge, no new drain;
- scale-down: surplus workers of the desired revision are drained, not deleted at once (their live
  sessions finish), ignoring maxUnavailable as a Deployment's scale-down does. The least useful go
  first: a worker already draining, then one not available, then the one with the fewest live
  sessions (unknown counts as most), then the highest index.

Times are seconds on one clock of the mode's choosing: local mode's monotonic clock, Kubernetes
mode's epoch seconds of the API server's timestamps.

`count` applies the rules to one set of workers and is local mode's whole decision; Kubernetes mode,
which also updates drained workers in place and restores a draining worker on a revert, builds its
step from the single rules below. tests/unit/rollout/test_rollout_core.py runs one scenario table
against `count` and against both modes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from omni_operator.api.spec import RolloutSpec
from omni_operator.api.status import WorkerState  # the one worker state: router table, CRD status, rollouts


@dataclass(frozen=True)
class WorkerView:
    """One worker as a mode observed it, in the terms the rules count."""

    name: str
    index: int | None
    """The `-w<i>` of its name; None for a name outside the scheme."""
    revision: str | None
    phase: WorkerState
    """What the router is told: starting, ready or draining."""
    admitted: bool = False
    """Available: ready, and taken into rotation by the router."""
    ever_admitted: bool = False
    """The progress deadline no longer applies (local: admitted once; Kubernetes: ready now)."""
    started_at: float | None = 0.0
    """When the progress-deadline clock started; None: it does not run yet."""
    draining_since: float | None = None
    """When its drain began; None: unknown (counts as now)."""
    sessions: int | None = None
    """Live sessions the router reported; None when unknown."""


@dataclass(frozen=True)
class Strategy:
    """spec.rollout, as the rules read it."""

    max_surge: int = 1
    max_unavailable: int = 0
    drain_timeout_seconds: float = 600
    progress_deadline_seconds: float = 600
    paused: bool = False

    @classmethod
    def of(cls, spec: RolloutSpec) -> Strategy:
        return cls(
            max_surge=spec.max_surge,
            max_unavailable=spec.max_unavailable,
            drain_timeout_seconds=spec.drain_timeout_seconds,
            progress_deadline_seconds=spec.progress_deadline_seconds,
            paused=spec.paused,
        )


@dataclass(frozen=True)
class Stop:
    """A draining worker whose drain is over, and why."""

    name: str
    reason: str


V = TypeVar("V", bound=WorkerView)


def order(w: WorkerView) -> tuple[int, str]:
    """By index; names outside the scheme last."""
    return (w.index if w.index is not None else 1 << 30, w.name)


def surge_room(*, existing: int, workers: int, max_surge: int, capacity: int | None = None) -> int:
    """Workers that may be started now (negative: over the ceiling): at most `workers + maxSurge`
    exist at once, and at most `capacity`."""
    ceiling = workers + max_surge
    if capacity is not None:
        ceiling = min(ceiling, capacity)
    return ceiling - existing


def drain_budget(*, available: int, workers: int, max_unavailable: int) -> int:
    """Available workers that may start draining now (may be negative)."""
    return available - max(0, workers - max_unavailable)


def drain_left(w: WorkerView, *, now: float, timeout_s: float) -> float:
    """Seconds until `w`'s drain times out (0 or less: it has)."""
    since = w.draining_since if w.draining_since is not None else now
    return since + timeout_s - now


def drain_end(w: WorkerView, *, now: float, timeout_s: float) -> str | None:
    """Why `w`'s drain is over, or None while it goes on."""
    if w.sessions == 0:
        return "idle"
    if drain_left(w, now=now, timeout_s=timeout_s) <= 0:
        live = "unknown" if w.sessions is None else str(w.sessions)
        return f"drainTimeoutSeconds ({timeout_s:g}s) passed with {live} live sessions"
    return None


def deadline_left(w: WorkerView, *, now: float, deadline_s: float) -> float | None:
    """Seconds until `w` misses its progress deadline (0 or less: it has); None when no clock runs."""
    if w.ever_admitted or w.started_at is None:
        return None
    return w.started_at + deadline_s - now


def _usefulness(w: WorkerView) -> tuple[bool, bool, float, int]:
    live = math.inf if w.sessions is None else w.sessions
    return (w.phase is not WorkerState.draining, w.admitted, live, -order(w)[0])


def scale_down(workers: Sequence[V], *, keep: int) -> list[V]:
    """The workers beyond the first `keep` to go, least useful first (see the module docstring)."""
    surplus = max(0, len(workers) - keep)
    return sorted(workers, key=_usefulness)[:surplus]


@dataclass(frozen=True)
class Count:
    """The rules applied to one set of workers of one mode."""

    new: tuple[WorkerView, ...]
    """Workers of the desired revision, not draining (scale-down surplus included)."""
    old: tuple[WorkerView, ...]
    """Workers of another revision, not draining."""
    draining: tuple[WorkerView, ...]
    available: int
    """Available workers, not draining."""
    stops: tuple[Stop, ...]
    """Draining workers whose drain is over."""
    stalled: tuple[WorkerView, ...] = ()
    """Workers of the desired revision past their progress deadline."""
    drain: tuple[WorkerView, ...] = ()
    """Workers to drain now: the scale-down surplus, old ones not available, old ones the floor allows."""
    start: int = 0
    """New workers of the desired revision to start now."""


def count(
    workers: Sequence[WorkerView],
    *,
    revision: str,
    desired: int,
    strategy: Strategy,
    now: float,
    capacity: int | None = None,
) -> Count:
    """What the rules allow now: drains that end, drains that begin, workers to start. Past a
    progress deadline, or paused with workers of another revision left, nothing begins."""
    workers = sorted(workers, key=order)
    draining = [w for w in workers if w.phase is WorkerState.draining]
    active = [w for w in workers if w.phase is not WorkerState.draining]
    new = [w for w in active if w.revision == revision]
    old = [w for w in active if w.revision != revision]
    timeout = strategy.drain_timeout_seconds
    stops = tuple(
        Stop(w.name, reason) for w in draining if (reason := drain_end(w, now=now, timeout_s=timeout))
    )
    base = Count(
        new=tuple(new),
        old=tuple(old),
        draining=tuple(draining),
        available=sum(w.admitted for w in active),
        stops=stops,
    )
    deadline = strategy.progress_deadline_seconds
    stalled = tuple(
        w for w in new if (left := deadline_left(w, now=now, deadline_s=deadline)) is not None and left <= 0
    )
    if stalled or (strategy.paused and old):
        return replace(base, stalled=stalled)

    drains = scale_down(new, keep=desired)
    kept = [w for w in new if w not in drains]
    drains += [w for w in old if not w.admitted]
    budget = drain_budget(
        available=base.available - sum(w.admitted for w in drains),
        workers=desired,
        max_unavailable=strategy.max_unavailable,
    )
    drains += [w for w in old if w.admitted][: max(0, budget)]
    room = surge_room(existing=len(workers), workers=desired, max_surge=strategy.max_surge, capacity=capacity)
    return replace(base, drain=tuple(sorted(drains, key=order)), start=max(0, min(desired - len(kept), room)))
