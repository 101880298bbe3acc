"""The rollout decision of local mode: given the workers that exist and what the spec wants, what
to do next.

Pure and stateless: the supervisor observes its workers on every tick, calls `next_step`, and
carries out the answer (stop, drain, start), so each decision is a table test and the supervisor
only does I/O. The rules are a Deployment's, counted in workers (DESIGN.md, "Rollouts"):

- at most `workers + maxSurge` workers exist at once, draining and stopping ones included (they
  still hold their sessions, ports and GPUs); a stop frees its room only once it has happened, so
  one step never stops a worker and starts its replacement;
- at least `workers - maxUnavailable` workers stay available (ready, `ready` in the worker table
  and in rotation at the router) when an old worker is drained;
- old workers that are not available serve nothing new, so draining them costs no availability;
- a draining worker is stopped once its live sessions reach 0 or `drainTimeoutSeconds` pass;
- a worker of the desired revision never admitted within `progressDeadlineSeconds` of its start
  stops the rollout: nothing more is drained or started until a new spec arrives;
- `paused` holds a rollout (workers of another revision exist) at its current step; drains
  already begun still finish. With every worker on the desired revision, scaling still applies.

Scaling with no revision change uses the same rules; scale-down (more workers of the desired
revision than wanted) ignores maxUnavailable, as a Deployment's does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from omni_operator.api.spec import RolloutSpec


class Phase(StrEnum):
    """A worker's phase as local mode tracks it (the worker table's states minus `gone`)."""

    starting = "starting"
    ready = "ready"
    draining = "draining"


class Status(StrEnum):
    complete = "complete"  # every worker on the desired revision, the desired count, all available
    progressing = "progressing"
    paused = "paused"
    deadline_exceeded = "deadline_exceeded"
    blocked = "blocked"  # nothing can happen: no room for a new worker and no worker may be drained

    @property
    def final(self) -> bool:
        """The rollout will not move on by itself (a follower can stop watching)."""
        return self is not Status.progressing


@dataclass(frozen=True)
class WorkerView:
    """What the supervisor observed about one worker on this tick."""

    name: str
    index: int
    revision: str
    phase: Phase
    admitted: bool = False  # /ready 200, `ready` in the worker table and in rotation at the router
    ever_admitted: bool = False
    started_at: float = 0.0  # when the worker was created (not when a crashed process restarted)
    draining_since: float | None = None
    sessions: int | None = None  # live sessions at the router; None when unknown


@dataclass(frozen=True)
class Desired:
    revision: str
    workers: int
    max_surge: int = 1
    max_unavailable: int = 0
    drain_timeout_s: float = 600.0
    progress_deadline_s: float = 600.0
    paused: bool = False
    capacity: int | None = None  # most workers this machine holds at once (GPUs); None: no limit

    @classmethod
    def of(cls, *, revision: str, workers: int, rollout: RolloutSpec, capacity: int | None) -> Desired:
        return cls(
            revision=revision,
            workers=workers,
            max_surge=rollout.max_surge,
            max_unavailable=rollout.max_unavailable,
            drain_timeout_s=float(rollout.drain_timeout_seconds),
            progress_deadline_s=float(rollout.progress_deadline_seconds),
            paused=rollout.paused,
            capacity=capacity,
        )


@dataclass(frozen=True)
class Stop:
    name: str
    reason: str


@dataclass(frozen=True)
class Step:
    status: Status
    message: str
    start: int = 0  # new workers of the desired revision to start now
    drain: tuple[str, ...] = ()  # workers to mark draining now
    stop: tuple[Stop, ...] = ()  # draining workers to stop and remove now


def _stops(draining: Sequence[WorkerView], desired: Desired, now: float) -> tuple[Stop, ...]:
    stops: list[Stop] = []
    for worker in draining:
        if worker.sessions == 0:
            stops.append(Stop(worker.name, "idle"))
            continue
        since = worker.draining_since if worker.draining_since is not None else now
        if now - since >= desired.drain_timeout_s:
            live = "unknown" if worker.sessions is None else str(worker.sessions)
            stops.append(
                Stop(
                    worker.name,
                    f"drainTimeoutSeconds ({desired.drain_timeout_s:g}s) passed with {live} live sessions",
                )
            )
    return tuple(stops)


def next_step(workers: Sequence[WorkerView], desired: Desired, *, now: float) -> Step:
    """The next actions towards `desired`; call again after carrying them out (or on the next tick)."""
    workers = sorted(workers, key=lambda w: w.index)
    draining = [w for w in workers if w.phase is Phase.draining]
    active = [w for w in workers if w.phase is not Phase.draining]
    new = [w for w in active if w.revision == desired.revision]
    old = [w for w in active if w.revision != desired.revision]
    available = sum(w.admitted for w in active)
    stops = _stops(draining, desired, now)
    counts = (
        f"{len(new)}/{desired.workers} workers on revision {desired.revision}, "
        f"{available} available, {len(old)} old, {len(draining)} draining"
    )

    stalled = [w for w in new if not w.ever_admitted and now - w.started_at >= desired.progress_deadline_s]
    if stalled:
        return Step(
            status=Status.deadline_exceeded,
            message=(
                f"{stalled[0].name} (revision {desired.revision}) was not ready within "
                f"progressDeadlineSeconds ({desired.progress_deadline_s:g}s): no more workers are "
                f"replaced and {len(old)} old workers keep serving; fix the spec and run `omni up -f` again"
            ),
            stop=stops,
        )
    if desired.paused and old:
        return Step(status=Status.paused, message=f"held by rollout.paused: {counts}", stop=stops)

    min_available = max(0, desired.workers - desired.max_unavailable)
    max_total = desired.workers + desired.max_surge
    if desired.capacity is not None:
        max_total = min(max_total, desired.capacity)

    drains: list[WorkerView] = []
    # Scale-down: the least useful workers of the desired revision go first.
    excess = len(new) - desired.workers
    if excess > 0:
        drains += sorted(new, key=lambda w: (w.admitted, -w.index))[:excess]
        new = [w for w in new if w not in drains]
    # Old workers that are not available serve nothing new: draining them costs no availability.
    drains += [w for w in old if not w.admitted]
    budget = available - sum(w.admitted for w in drains) - min_available
    drains += [w for w in old if w.admitted][: max(0, budget)]

    need = desired.workers - len(new)
    start = max(0, min(need, max_total - len(workers)))
    drain = tuple(w.name for w in sorted(drains, key=lambda w: w.index))

    if not old and not draining and not drain and need == 0 and all(w.admitted for w in new):
        return Step(
            status=Status.complete,
            message=f"{desired.workers} workers on revision {desired.revision}, all available",
        )
    waiting = draining or any(not w.admitted for w in new)
    if not (start or drain or waiting):
        return Step(
            status=Status.blocked,
            message=(
                f"no room for a new worker: this machine holds {desired.capacity} workers at once "
                f"and {len(workers)} exist ({counts}); set rollout.maxUnavailable: 1 so an old "
                "worker is drained first"
            ),
        )
    return Step(status=Status.progressing, message=counts, start=start, drain=drain, stop=stops)
