"""Status of an OmniDeployment computed from its plan and its observed pods.

Mirrors Deployment semantics where they fit (observedGeneration; Progressing True with
NewRevisionAvailable once complete, False with ProgressDeadlineExceeded when stuck) and adds what a
pipeline needs: per-stage readiness, a worker table, and a Degraded condition whose reason says why
(InsufficientGPUs when the scheduler reports too few GPUs, instead of a silent Pending).
Transition times only move when a condition's status flips, so recomputing an unchanged world gives
an equal status and the caller writes nothing.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from omni_operator.api.status import (
    Condition,
    ConditionType,
    OmniDeploymentStatus,
    Phase,
    Reason,
    StageReadiness,
    WorkerCounts,
    WorkerState,
    WorkerStatus,
)
from omni_operator.plan.types import Plan, StagePod, WorkerPlan
from omni_operator.reconcile.observe import PodView
from omni_operator.reconcile.rollout import RolloutStep


@dataclass(frozen=True)
class WorkerObservation:
    name: str
    revision: str
    exists: bool
    updated: bool
    ready: bool

    @property
    def state(self) -> WorkerState:
        return WorkerState.ready if self.ready else WorkerState.starting


def _pod_updated(planned: StagePod, view: PodView, worker: WorkerPlan) -> bool:
    if view.pod_revision is not None:
        return view.pod_revision == planned.revision
    return view.worker_revision == worker.revision


def observe_worker(worker: WorkerPlan, pods: dict[str, PodView]) -> WorkerObservation:
    views = [pods.get(p.name) for p in worker.pods]
    live = [(p, v) for p, v in zip(worker.pods, views, strict=True) if v is not None and not v.terminating]
    complete = len(live) == len(worker.pods)
    return WorkerObservation(
        name=worker.name,
        revision=worker.revision,
        exists=bool(live),
        updated=complete and all(_pod_updated(p, v, worker) for p, v in live),
        ready=complete and all(v.running_ready for _, v in live),
    )


def _stage_readiness(plan: Plan, pods: dict[str, PodView], desired: int) -> dict[str, StageReadiness]:
    out: dict[str, StageReadiness] = {}
    for stage in plan.stages:
        ready = 0
        for worker in plan.workers:
            hosts = [p for p in worker.pods if stage in p.stages]
            if hosts and all(p.name in pods and pods[p.name].running_ready for p in hosts):
                ready += 1
        out[stage.value] = StageReadiness(desired=desired, ready=ready)
    return out


def _parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass(frozen=True)
class Trouble:
    reason: Reason
    message: str


def scheduling_trouble(pods: Iterable[PodView], *, gpu_resource: str) -> Trouble | None:
    """The most telling problem among the pods: failed stages first, then unschedulable pods."""
    live = [p for p in pods if not p.terminating]
    failed = [p for p in live if p.phase == "Failed"]
    if failed:
        return Trouble(Reason.stage_failed, f"pod {failed[0].name} failed: {failed[0].failure}")
    stuck = sorted((p for p in live if p.unschedulable), key=lambda p: p.name)
    short = [p for p in stuck if f"Insufficient {gpu_resource}" in (p.unschedulable or "")]
    if short:
        names = ", ".join(p.name for p in short[:3]) + (" ..." if len(short) > 3 else "")
        return Trouble(
            Reason.insufficient_gpus,
            f"{len(short)} pod(s) cannot be scheduled for lack of {gpu_resource} ({names}): "
            f"{short[0].unschedulable}; add GPU nodes or lower spec.workers",
        )
    if stuck:
        return Trouble(
            Reason.unschedulable, f"pod {stuck[0].name} cannot be scheduled: {stuck[0].unschedulable}"
        )
    return None


class _Conditions:
    """Builds conditions keeping lastTransitionTime from the previous status when nothing flipped."""

    def __init__(self, previous: Sequence[Condition], *, now: str, generation: int | None) -> None:
        self.previous = {c.type: c for c in previous}
        self.now = now
        self.generation = generation
        self.items: list[Condition] = []

    def add(
        self, kind: ConditionType, status: bool | str, reason: Reason, message: str, *, reset: bool = False
    ) -> None:
        value = status if isinstance(status, str) else ("True" if status else "False")
        prev = self.previous.get(kind)
        kept = prev is not None and prev.status == value and not reset
        self.items.append(
            Condition(
                type=kind,
                status=value,
                reason=reason.value,
                message=message,
                last_transition_time=prev.last_transition_time if kept and prev else self.now,
                observed_generation=self.generation,
            )
        )


def compute_status(
    *,
    plan: Plan,
    pods: Sequence[PodView],
    generation: int | None,
    previous: OmniDeploymentStatus | None,
    now: str,
    endpoint: str | None,
    selector: str | None,
    progress_deadline_seconds: int,
    rollout: RolloutStep | None = None,
    desired: int | None = None,
) -> OmniDeploymentStatus:
    """`rollout` (with `desired`, spec.workers): `plan` holds only the workers at the update revision
    and the rollout step supplies every worker's state, pause and progress deadline."""
    by_name = {p.name: p for p in pods}
    in_place = set(rollout.update) if rollout is not None else set()
    workers = [observe_worker(w, by_name) for w in plan.workers]
    workers = [w if w.name not in in_place else replace(w, updated=False) for w in workers]
    planned_names = {w.name for w in plan.workers}
    surplus = sorted(
        {p.worker for p in pods if p.worker and p.worker not in planned_names and not p.terminating}
    )
    desired = len(workers) if desired is None else desired
    ready = sum(w.ready for w in workers)
    if rollout is not None:  # serving workers of any revision count, draining ones do not
        ready = sum(s.state is WorkerState.ready for s in rollout.workers)
    updated = sum(w.updated for w in workers)
    available = sum(w.ready and w.updated for w in workers)
    existing = {p.worker for p in pods if p.worker and not p.terminating}
    complete = available == desired and not surplus
    trouble = scheduling_trouble(pods, gpu_resource=plan.scheduling.gpu_resource_name)
    prev = previous or OmniDeploymentStatus()

    conds = _Conditions(prev.conditions, now=now, generation=generation)
    if desired == 0:
        conds.add(ConditionType.ready, True, Reason.no_workers, "spec.workers is 0")
    elif ready >= desired:
        conds.add(ConditionType.ready, True, Reason.all_workers_ready, f"{ready}/{desired} workers ready")
    else:
        conds.add(ConditionType.ready, False, Reason.workers_not_ready, f"{ready}/{desired} workers ready")

    progressed = available > prev.workers.available or updated > prev.workers.updated
    prev_progress = next((c for c in prev.conditions if c.type is ConditionType.progressing), None)
    in_progress_message = f"{available}/{desired} workers available at revision {plan.revision}" + (
        f", {len(surplus)} to remove" if surplus else ""
    )
    if complete:
        conds.add(
            ConditionType.progressing,
            True,
            Reason.new_revision_available,
            f"{desired} worker(s) run revision {plan.revision}",
        )
    elif rollout is not None:
        if rollout.paused:
            conds.add(
                ConditionType.progressing,
                "Unknown",
                Reason.rollout_paused,
                f"rollout paused (spec.rollout.paused): {in_progress_message}",
            )
        elif rollout.stuck:
            conds.add(ConditionType.progressing, False, Reason.progress_deadline_exceeded, rollout.stuck)
        else:
            conds.add(ConditionType.progressing, True, Reason.rollout_in_progress, in_progress_message)
    else:
        started = _parse_time(prev_progress.last_transition_time) if prev_progress else None
        in_progress = prev_progress is not None and prev_progress.reason == Reason.rollout_in_progress.value
        stuck = (
            in_progress
            and not progressed
            and started is not None
            and (_parse_time(now) or started) - started > dt.timedelta(seconds=progress_deadline_seconds)
        )
        if stuck or (
            prev_progress is not None
            and prev_progress.reason == Reason.progress_deadline_exceeded.value
            and not progressed
        ):
            conds.add(
                ConditionType.progressing,
                False,
                Reason.progress_deadline_exceeded,
                f"no progress for {progress_deadline_seconds} s: {available}/{desired} workers available",
            )
        else:
            conds.add(
                ConditionType.progressing,
                True,
                Reason.rollout_in_progress,
                in_progress_message,
                reset=not in_progress or progressed,
            )
    if trouble is not None:
        conds.add(ConditionType.degraded, True, trouble.reason, trouble.message)
    else:
        conds.add(ConditionType.degraded, False, Reason.reconciled, "")

    if complete:
        phase = Phase.ready
    elif (
        trouble is not None
        and trouble.reason in (Reason.insufficient_gpus, Reason.unschedulable)
        and ready == 0
    ):
        phase = Phase.pending
    elif trouble is not None:
        phase = Phase.degraded
    else:
        phase = Phase.progressing

    revisions = Counter(p.worker_revision for p in pods if p.worker_revision and not p.terminating)
    current = plan.revision if complete else (prev.current_revision or _most_common(revisions))
    return OmniDeploymentStatus(
        observed_generation=generation,
        phase=phase,
        conditions=conds.items,
        workers=WorkerCounts(desired=desired, ready=ready, updated=updated, available=available),
        replicas=len(existing),
        stages=_stage_readiness(plan, by_name, desired),
        worker_states=list(rollout.workers)
        if rollout is not None
        else [WorkerStatus(name=w.name, revision=w.revision, state=w.state) for w in workers],
        current_revision=current,
        update_revision=plan.revision,
        endpoint=endpoint,
        selector=selector,
    )


def _most_common(counter: Counter[str]) -> str | None:
    return counter.most_common(1)[0][0] if counter else None


def invalid_spec_status(
    *, message: str, generation: int | None, previous: OmniDeploymentStatus | None, now: str
) -> OmniDeploymentStatus:
    """A spec the planner rejects: existing children are left alone, the status says why."""
    prev = previous or OmniDeploymentStatus()
    conds = _Conditions(prev.conditions, now=now, generation=generation)
    conds.add(ConditionType.ready, False, Reason.invalid_spec, message)
    conds.add(ConditionType.progressing, False, Reason.invalid_spec, message)
    conds.add(ConditionType.degraded, True, Reason.invalid_spec, message)
    return prev.model_copy(
        update={"observed_generation": generation, "phase": Phase.failed, "conditions": conds.items}
    )


ERROR_MESSAGE_LIMIT = 1024
"""Characters of an exception's text kept in a condition message (as Events keep)."""


def error_message(error: BaseException, *, limit: int = ERROR_MESSAGE_LIMIT) -> str:
    """`TypeName: text` on one line (a pydantic error spans several), elided past `limit` chars."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def reconcile_error_status(
    *, message: str, generation: int | None, previous: OmniDeploymentStatus | None, now: str
) -> OmniDeploymentStatus:
    """A reconcile pass that raised (an operator bug, not the API server): the children are as the
    pass left them and Progressing keeps what the last good pass said; Ready and Degraded say why
    until a pass succeeds, when compute_status rebuilds every condition."""
    prev = previous or OmniDeploymentStatus()
    conds = _Conditions(prev.conditions, now=now, generation=generation)
    conds.add(ConditionType.ready, False, Reason.reconcile_error, message)
    conds.add(ConditionType.degraded, True, Reason.reconcile_error, message)
    replaced = {c.type for c in conds.items}
    order = list(ConditionType)
    conditions = sorted(
        [*conds.items, *(c for c in prev.conditions if c.type not in replaced)],
        key=lambda c: order.index(c.type),
    )
    return prev.model_copy(update={"phase": Phase.degraded, "conditions": conditions})


def status_body(status: OmniDeploymentStatus) -> dict:
    """The JSON the API server stores (camelCase, no nulls) — also what equality is judged on."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)
