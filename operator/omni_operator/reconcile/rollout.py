"""The rollout state machine: which worker to create, drain, update in place or delete next.

Stateless: every reconcile decides again from what the API server shows (each worker's revision
label, whether its pods match the update revision's templates, their readiness, the state its
Service publishes to the router, when its drain began, the live sessions routers reported). An
operator restart therefore resumes a rollout exactly where it stood.

The rules, in whole workers (spec.rollout):
- Workers in existence (terminating ones too: they still hold their GPUs) never exceed
  `workers + maxSurge`; new workers take the lowest index no existing worker uses, so a name is
  never reused while an old worker of that name still exists.
- A drain never starts when it would leave fewer than `workers - maxUnavailable` workers serving.
  Serving means: every pod ready *and* the Service already published `ready` on an earlier pass
  (the router has seen it), so a new worker is admitted before an old one stops taking sessions.
- A worker that may hold sessions (its Service says ready) is drained before anything in it
  changes. Once drained (every router reported 0 live sessions for this drain, or
  drainTimeoutSeconds passed), it is updated in place while the deployment still lacks workers of
  the update revision (only the pods whose template changed are replaced: a talker-only change
  keeps the loaded thinker), otherwise deleted. A worker that never published ready holds no
  sessions and is updated or deleted at once.
- A draining worker of the update revision (a revert mid-rollout) is restored instead of replaced.
- Paused, or a worker of the update revision not ready within progressDeadlineSeconds: no new step
  starts (no surge, no drain, no replacement); a drain already under way still finishes; scaling
  up to spec.workers still happens.
- Scale-down: the rollout core picks the surplus workers of the update revision (already draining,
  not serving, fewest sessions, highest index first); one that may hold sessions (its Service says
  ready) is drained like an outdated worker, ignoring maxUnavailable, then deleted; one that never
  published ready is deleted at once.

The counting (surge ceiling, availability floor, drain completion, progress deadline, scale-down
choice) is the rollout core's (omni_operator/rollout), shared with local mode: each observed worker
is read as the core's `WorkerView` (`ObservedWorker.shared`) on a clock of epoch seconds.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from omni_operator.api.status import Reason, WorkerState, WorkerStatus
from omni_operator.reconcile.diff import ChildDiff
from omni_operator.reconcile.events import EventSpec
from omni_operator.reconcile.observe import ChildKey
from omni_operator.rollout import Strategy, WorkerView, core

__all__ = ["ObservedWorker", "RolloutStep", "Strategy", "gate_replacements", "rollout_events", "step_rollout"]


@dataclass(frozen=True)
class ObservedWorker:
    """One worker as observed (every field comes from the API server)."""

    name: str
    index: int | None
    revision: str | None
    """Its Service's revision label (what the router is told)."""
    stale_pods: tuple[str, ...] = ()
    """Live pods whose template differs from the update revision's for this index."""
    ready: bool = False
    """Every pod it should have exists, Running and Ready."""
    published: WorkerState | None = None
    """The state its Service annotates for the router (None: no Service)."""
    drain_started: dt.datetime | None = None
    sessions: int | None = None
    """Live sessions every router replica reported for this drain; None while unknown."""
    since: dt.datetime | None = None
    """When its newest live pod was created (the progress-deadline clock)."""
    terminating: bool = False
    """Only terminating objects are left: it is going away, but still holds its resources."""

    def current(self, revision: str) -> bool:
        return self.revision == revision and not self.stale_pods

    @property
    def serving(self) -> bool:
        return self.ready and self.published is WorkerState.ready

    @property
    def shared(self) -> WorkerView:
        """This worker as the rollout core counts it (times in epoch seconds)."""
        draining = self.published is WorkerState.draining
        return WorkerView(
            name=self.name,
            index=self.index,
            revision=self.revision,
            phase=WorkerState.draining
            if draining
            else WorkerState.ready
            if self.ready
            else WorkerState.starting,
            admitted=self.serving,
            ever_admitted=self.ready,
            started_at=self.since.timestamp() if self.since is not None else None,
            draining_since=self.drain_started.timestamp() if self.drain_started is not None else None,
            sessions=self.sessions,
        )


@dataclass(frozen=True)
class RolloutStep:
    """What to do now. Workers not named in keep/update/delete are left untouched (hold)."""

    keep: tuple[int, ...] = ()
    """Indexes rendered at the update revision: current workers, new ones, in-place updates."""
    create: tuple[int, ...] = ()
    update: tuple[str, ...] = ()
    """Drained (or never-serving) workers whose stale pods are replaced now, keeping their name."""
    update_pods: tuple[str, ...] = ()
    """The stale pods of the `update` workers: the only pods a template change may delete."""
    drain: tuple[str, ...] = ()
    undrain: tuple[str, ...] = ()
    delete: tuple[str, ...] = ()
    hold: tuple[str, ...] = ()
    """Outdated workers left as they are this pass (serving, or draining)."""
    publish: tuple[tuple[str, WorkerState], ...] = ()
    """Held workers whose Service must announce a new state (drain included)."""
    workers: tuple[WorkerStatus, ...] = ()
    """Every worker after this step, by index, with its state (the status table)."""
    paused: bool = False
    """Paused with work left."""
    stuck: str | None = None
    """Why the rollout stopped (progress deadline exceeded), for the Progressing condition."""
    requeue_after: float | None = None
    """Seconds until a drain or progress deadline passes, so a reconcile looks again then."""


def _order(w: ObservedWorker) -> tuple[int, str]:
    return core.order(w.shared)


def _free_indexes(used: Iterable[int | None], count: int) -> list[int]:
    taken = {i for i in used if i is not None}
    out: list[int] = []
    i = 0
    while len(out) < count:
        if i not in taken:
            out.append(i)
        i += 1
    return out


def step_rollout(
    *,
    workers: Sequence[ObservedWorker],
    desired: int,
    revision: str,
    strategy: Strategy,
    now: dt.datetime,
    name_of: Callable[[int], str],
) -> RolloutStep:
    """The next step towards `desired` workers of `revision` (see the module docstring)."""
    workers = sorted(workers, key=_order)
    clock = now.timestamp()
    total = len(workers)
    live = [w for w in workers if not w.terminating]
    cur = [w for w in live if w.current(revision)]
    old = [w for w in live if not w.current(revision)]
    removed: list[ObservedWorker] = []
    updated: list[ObservedWorker] = []
    wakeups: list[float] = []

    # Scale-down of up-to-date workers: the core picks them; they go like outdated workers, below.
    surplus = {v.name for v in core.scale_down([w.shared for w in cur], keep=desired)}
    going = [w for w in cur if w.name in surplus]
    cur = [w for w in cur if w.name not in surplus]
    undrain = [w for w in cur if w.published is WorkerState.draining]

    stuck = None
    if not strategy.paused:
        for w in cur:
            left = core.deadline_left(w.shared, now=clock, deadline_s=strategy.progress_deadline_seconds)
            if left is None:
                continue
            if left <= 0:
                stuck = stuck or (
                    f"worker {w.name} not ready {strategy.progress_deadline_seconds} s after its pods "
                    f"were created (revision {revision}); no more workers are replaced"
                )
            else:
                wakeups.append(left)
    held_back = strategy.paused or stuck is not None
    n_cur = len(cur)

    # Drains under way finish, even when paused or stuck: their sessions have already moved.
    draining = sorted(
        (w for w in [*old, *going] if w.published is WorkerState.draining),
        key=_order,
    )
    still_draining: list[ObservedWorker] = []
    for w in draining:
        if core.drain_end(w.shared, now=clock, timeout_s=strategy.drain_timeout_seconds) is not None:
            if n_cur < desired and w.index is not None:
                updated.append(w)
                n_cur += 1
            else:
                removed.append(w)
        else:
            still_draining.append(w)
            wakeups.append(core.drain_left(w.shared, now=clock, timeout_s=strategy.drain_timeout_seconds))

    # Surplus workers that may hold sessions drain at once, whatever the floor; others just go.
    scale_drain = [w for w in going if w.published is WorkerState.ready]
    removed += [w for w in going if w.published not in (WorkerState.ready, WorkerState.draining)]

    # Outdated workers that never published ready hold no sessions: replace them now.
    serving_old = [w for w in old if w.published is not WorkerState.draining]
    held: list[ObservedWorker] = []
    for w in serving_old:
        if w.published is WorkerState.ready or held_back:
            held.append(w)
        elif n_cur < desired and w.index is not None:
            updated.append(w)
            n_cur += 1
        else:
            removed.append(w)

    # Surge: create while up-to-date workers (and drains that will be updated in place) fall short.
    pending_updates = min(len(still_draining), max(0, desired - n_cur))
    needed = desired - n_cur - pending_updates
    room = core.surge_room(existing=total, workers=desired, max_surge=strategy.max_surge)
    if held_back:  # only what scaling up asks for
        room = min(room, desired - (n_cur + len(held) + len(still_draining)))
    create = _free_indexes((w.index for w in workers), max(0, min(needed, room)))

    # Drains: as many as the availability floor allows, lowest index first.
    drain: list[ObservedWorker] = []
    if not held_back:
        serving = [w for w in cur if w.serving and w not in undrain] + [w for w in held if w.serving]
        budget = core.drain_budget(
            available=len(serving), workers=desired, max_unavailable=strategy.max_unavailable
        )
        drain = [w for w in held if w.serving][: max(0, budget)]
    drain = sorted([*drain, *scale_drain], key=_order)
    held = sorted([*held, *scale_drain], key=_order)
    if drain:
        wakeups.append(float(strategy.drain_timeout_seconds))

    # Held workers announce their state: draining, or ready/starting as their pods are.
    publish: list[tuple[str, WorkerState]] = []
    states: dict[str, WorkerStatus] = {}
    for w in held:
        state = (
            WorkerState.draining if w in drain else (WorkerState.ready if w.ready else WorkerState.starting)
        )
        if w.published is not None and w.published is not state:
            publish.append((w.name, state))
        states[w.name] = WorkerStatus(name=w.name, revision=w.revision or "", state=state)
    for w in still_draining:
        states[w.name] = WorkerStatus(name=w.name, revision=w.revision or "", state=WorkerState.draining)
    for w in cur:
        state = WorkerState.ready if w.ready else WorkerState.starting
        states[w.name] = WorkerStatus(name=w.name, revision=revision, state=state)
    for w in updated:
        states[w.name] = WorkerStatus(name=w.name, revision=revision, state=WorkerState.starting)
    gone = [*removed, *(w for w in workers if w.terminating)]
    for w in gone:
        states[w.name] = WorkerStatus(name=w.name, revision=w.revision or "", state=WorkerState.gone)

    keep_views = [*cur, *updated]
    keep = sorted([*(w.index for w in keep_views if w.index is not None), *create])
    for i in create:
        states[name_of(i)] = WorkerStatus(name=name_of(i), revision=revision, state=WorkerState.starting)
    order_of = {w.name: _order(w) for w in workers} | {name_of(i): (i, name_of(i)) for i in create}
    work_left = bool(old or going or removed or create or n_cur < desired)
    positive = [s for s in wakeups if s > 0]
    return RolloutStep(
        keep=tuple(keep),
        create=tuple(create),
        update=tuple(w.name for w in updated),
        update_pods=tuple(p for w in updated for p in w.stale_pods),
        drain=tuple(w.name for w in drain),
        undrain=tuple(w.name for w in undrain),
        delete=tuple(w.name for w in removed),
        hold=tuple(w.name for w in [*held, *still_draining]),
        publish=tuple(publish),
        workers=tuple(sorted(states.values(), key=lambda s: order_of[s.name])),
        paused=strategy.paused and work_left,
        stuck=stuck,
        requeue_after=min(positive) + 1.0 if positive else None,
    )


def gate_replacements(diff: ChildDiff, *, allowed: Iterable[ChildKey]) -> ChildDiff:
    """Only `allowed` children may be replaced: self-heal's pods and the stale pods of workers the
    rollout updates now. Any other changed pod waits for the rollout to drain its worker; a pod whose
    template is unchanged (kept through an in-place update, its labels still naming the revision it
    was created at) is never replaced for it."""
    ok = set(allowed)
    return replace(diff, replace=tuple(k for k in diff.replace if k in ok))


def rollout_events(step: RolloutStep, *, revision: str, drain_timeout_seconds: int) -> list[EventSpec]:
    """One Event per step, for `kubectl describe` (creates and deletes are announced by decide)."""
    revisions = {w.name: w.revision for w in step.workers}
    out = [
        EventSpec(
            "Normal",
            Reason.worker_draining.value,
            f"worker {name} (revision {revisions.get(name) or '?'}) draining: no new sessions; replaced "
            f"when its sessions end, at most {drain_timeout_seconds} s",
        )
        for name in step.drain
    ]
    for name in step.update:
        pods = [p for p in step.update_pods if p.startswith(f"{name}-")]
        what = ", ".join(pods) if pods else "no pod (only its revision label)"
        out.append(
            EventSpec(
                "Normal", Reason.worker_updating, f"worker {name} -> revision {revision}: replacing {what}"
            )
        )
    out += [
        EventSpec(
            "Normal",
            Reason.worker_restored,
            f"worker {name} is at revision {revision} again: drain cancelled",
        )
        for name in step.undrain
    ]
    return out
