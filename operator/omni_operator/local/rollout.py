"""The rollout decision of local mode: given the workers that exist and what the spec wants, what
to do next.

Pure and stateless: the supervisor observes its workers on every tick, calls `next_step`, and
carries out the answer (stop, drain, start), so each decision is a table test and the supervisor
only does I/O. The counting rules (surge ceiling, availability floor, drain completion, progress
deadline, which workers a scale-down drains) are the rollout core's (omni_operator/rollout), shared
with Kubernetes mode; this module adds what is local mode's own:

- a stop frees its room only once it has happened, so one step never stops a worker and starts its
  replacement;
- a draining worker is never restored: a revert drains it to the end and starts a fresh one;
- `paused` holds a rollout (workers of another revision exist) at its current step; drains
  already begun still finish. With every worker on the desired revision, scaling still applies;
- with GPUs, `capacity` caps the workers that exist at once; no room and nothing to drain is
  `blocked`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from omni_operator.api.spec import RolloutSpec
from omni_operator.rollout import Stop, Strategy, WorkerView, count

__all__ = ["Desired", "Status", "Step", "Stop", "WorkerView", "next_step"]


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
        s = Strategy.of(rollout)
        timeouts = float(s.drain_timeout_seconds), float(s.progress_deadline_seconds)
        return cls(revision, workers, s.max_surge, s.max_unavailable, *timeouts, s.paused, capacity)

    @property
    def strategy(self) -> Strategy:
        """The rules' view of these settings (the core counts with it)."""
        timeouts = self.drain_timeout_s, self.progress_deadline_s
        return Strategy(self.max_surge, self.max_unavailable, *timeouts, self.paused)


@dataclass(frozen=True)
class Step:
    status: Status
    message: str
    start: int = 0  # new workers of the desired revision to start now
    drain: tuple[str, ...] = ()  # workers to mark draining now
    stop: tuple[Stop, ...] = ()  # draining workers to stop and remove now


def next_step(workers: Sequence[WorkerView], desired: Desired, *, now: float) -> Step:
    """The next actions towards `desired`; call again after carrying them out (or on the next tick)."""
    c = count(
        workers,
        revision=desired.revision,
        desired=desired.workers,
        strategy=desired.strategy,
        now=now,
        capacity=desired.capacity,
    )
    counts = (
        f"{len(c.new)}/{desired.workers} workers on revision {desired.revision}, "
        f"{c.available} available, {len(c.old)} old, {len(c.draining)} draining"
    )
    if c.stalled:
        return Step(
            status=Status.deadline_exceeded,
            message=(
                f"{c.stalled[0].name} (revision {desired.revision}) was not ready within "
                f"progressDeadlineSeconds ({desired.progress_deadline_s:g}s): no more workers are "
                f"replaced and {len(c.old)} old workers keep serving; fix the spec and run `omni up -f` again"
            ),
            stop=c.stops,
        )
    if desired.paused and c.old:
        return Step(status=Status.paused, message=f"held by rollout.paused: {counts}", stop=c.stops)

    drain = tuple(w.name for w in c.drain)
    if (
        not (c.old or c.draining or drain)
        and len(c.new) == desired.workers
        and all(w.admitted for w in c.new)
    ):
        return Step(
            status=Status.complete,
            message=f"{desired.workers} workers on revision {desired.revision}, all available",
        )
    waiting = c.draining or any(not w.admitted for w in c.new)
    if not (c.start or drain or waiting):
        return Step(
            status=Status.blocked,
            message=(
                f"no room for a new worker: this machine holds {desired.capacity} workers at once "
                f"and {len(workers)} exist ({counts}); set rollout.maxUnavailable: 1 so an old "
                "worker is drained first"
            ),
        )
    return Step(status=Status.progressing, message=counts, start=c.start, drain=drain, stop=c.stops)
