"""One reconcile, decided without touching the API server: body + observed children -> writes.

The straight line: parse the spec, plan it, take the next rollout step (rollout.py: which workers
exist at the update revision, which old ones drain, update in place or go), render the workers the
step keeps, publish each worker's state on its Service, pick pods to heal, diff desired against
observed (old workers the step holds are left out of it), compute the status, derive events.
k8s.py carries the decision out; a unit test can call `decide` with plain dicts and compare exactly.
An invalid spec never deletes anything: the children stay as they are and the status says why.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from pydantic import ValidationError

from omni_operator.api import labels
from omni_operator.api.load import SpecError, parse_deployments
from omni_operator.api.spec import OmniDeployment
from omni_operator.api.status import OmniDeploymentStatus, Reason, WorkerState
from omni_operator.plan import plan_deployment
from omni_operator.plan.types import Plan, PlanError, Target, WorkerPlan
from omni_operator.reconcile.diff import ChildDiff, diff_children
from omni_operator.reconcile.events import EventSpec, status_events
from omni_operator.reconcile.observe import ChildKey, Manifest, Observed, is_terminating, key_of
from omni_operator.reconcile.rollout import (
    RolloutStep,
    Strategy,
    gate_replacements,
    rollout_events,
    step_rollout,
)
from omni_operator.reconcile.selfheal import Heal, heal_decisions
from omni_operator.reconcile.status import (
    compute_status,
    error_message,
    invalid_spec_status,
    reconcile_error_status,
    status_body,
)
from omni_operator.reconcile.workers import (
    LIVE_SESSIONS_PREFIX,
    WorkerObjects,
    group_workers,
    parse_time,
    view_worker,
    with_template_hash,
    worker_index,
)

RenderFn = Callable[..., list[Manifest]]
"""render_manifests(plan, owner=(name, uid)) -> manifests (render/)."""


class Annotate(NamedTuple):
    """A merge patch of one child's annotations (None removes a key)."""

    key: ChildKey
    annotations: dict[str, str | None]


@dataclass(frozen=True)
class Decision:
    apply: tuple[Manifest, ...] = ()
    """Stamped manifests to server-side apply (creates first, then updates)."""
    delete: tuple[ChildKey, ...] = ()
    """Children to delete (replacements and leftovers)."""
    annotate: tuple[Annotate, ...] = ()
    """Annotation patches of worker Services outside the desired manifests (drain, state)."""
    status: dict | None = None
    """The new status body, or None when it equals the stored one."""
    events: tuple[EventSpec, ...] = ()
    diff: ChildDiff = field(default_factory=ChildDiff)
    plan: Plan | None = None
    """The plan as placed: the workers rendered at the update revision (current, new, in place)."""
    heals: tuple[Heal, ...] = ()
    requeue_after: float | None = None
    """Reconcile again after this many seconds (a drain or progress deadline falls then)."""
    rollout: RolloutStep | None = field(default=None, compare=False)

    @property
    def writes(self) -> int:
        return (
            len(self.apply)
            + len(self.delete)
            + len(self.annotate)
            + (self.status is not None)
            + len(self.events)
        )


def scale_selector(name: str) -> str:
    """status.selector for the scale subresource: one pod per worker (the pod serving its API), so an
    HPA counts workers."""
    return f"{labels.DEPLOYMENT}={name},{labels.COMPONENT}=worker,{labels.ROLE} in (api,worker)"


def router_endpoint(desired: Sequence[Manifest], namespace: str) -> str | None:
    for m in desired:
        if m["kind"] == "Service" and (m["metadata"].get("labels") or {}).get(labels.COMPONENT) == "router":
            port = (m.get("spec", {}).get("ports") or [{}])[0].get("port")
            return f"http://{m['metadata']['name']}.{namespace}.svc.cluster.local" + (
                f":{port}" if port else ""
            )
    return None


API_URL = f"{labels.PREFIX}/api-url"
"""Annotation on a worker's Service: the worker API's base URL (read by the router)."""


def publish_worker_states(desired: Sequence[Manifest], table: dict[str, dict[str, str]]) -> list[Manifest]:
    """Each worker's headless Service carries its entry of the worker table, for the router:
    WORKER_STATE (starting|ready|draining) and API_URL, keyed by worker name in `table`."""
    out = []
    for m in desired:
        lbls = m["metadata"].get("labels") or {}
        worker = lbls.get(labels.WORKER)
        if m["kind"] == "Service" and lbls.get(labels.COMPONENT) == "worker" and worker in table:
            m = {**m, "metadata": {**m["metadata"]}}
            m["metadata"]["annotations"] = {**(m["metadata"].get("annotations") or {}), **table[worker]}
        out.append(m)
    return out


def parse_body(body: Manifest) -> OmniDeployment:
    clean = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
    meta = body.get("metadata", {})
    return parse_deployments(
        json.dumps(clean), file=f"omnideployment {meta.get('namespace')}/{meta.get('name')}"
    )[0]


def previous_status(body: Manifest) -> OmniDeploymentStatus | None:
    raw = body.get("status")
    if not raw:
        return None
    try:
        return OmniDeploymentStatus.model_validate(raw)
    except ValidationError:
        return None  # a status written by someone else: start over


def decide(*, body: Manifest, observed: Observed, now: str, render: RenderFn) -> Decision:
    meta = body["metadata"]
    generation = meta.get("generation")
    previous = previous_status(body)
    try:
        dep = parse_body(body)
        plan = plan_deployment(dep, target=Target.kubernetes)
    except (SpecError, PlanError) as exc:
        return _invalid(str(exc), generation=generation, previous=previous, body=body, now=now)

    owner = (meta["name"], meta["uid"])
    templates = WorkerTemplates(dep, plan)
    groups = group_workers(observed.children)
    step = _rollout_step(
        plan=plan, dep=dep, groups=groups, templates=templates, render=render, owner=owner, now=now
    )
    placed = plan.model_copy(update={"workers": tuple(templates.worker(i) for i in step.keep)})
    desired = render(placed, owner=owner)
    pods = observed.pods
    heals = heal_decisions(workers=placed.workers, pods=pods)
    status = compute_status(
        plan=placed,
        pods=pods,
        generation=generation,
        previous=previous,
        now=now,
        endpoint=router_endpoint(desired, plan.namespace),
        selector=scale_selector(plan.deployment),
        progress_deadline_seconds=dep.spec.rollout.progress_deadline_seconds,
        rollout=step,
        desired=len(plan.workers),
    )
    states = {w.name: w.state for w in step.workers}
    table = {w.name: {labels.WORKER_STATE: states[w.name].value, API_URL: w.api_url} for w in placed.workers}
    desired = with_template_hash(publish_worker_states(desired, table), revision=plan.revision)
    held = set(step.hold)
    recreate = [ChildKey("v1", "Pod", name) for heal in heals for name in heal.pods]
    diff = gate_replacements(
        diff_children(
            desired=desired,
            observed=[c for c in observed.children if _worker_of(c) not in held],
            recreate=recreate,
        ),
        allowed={*recreate, *(ChildKey("v1", "Pod", name) for name in step.update_pods)},
    )
    annotate = _annotations(step=step, groups=groups, table=table, diff=diff, now=now)
    new_body = status_body(status)
    old_body = status_body(previous) if previous is not None else None
    changed = old_body != new_body
    if changed and old_body:
        # A merge patch keeps keys it does not mention: null out the ones that went away.
        new_body |= {key: None for key in old_body if key not in new_body}
    events = [*_action_events(plan=placed, diff=diff, observed=observed, heals=heals)]
    events += rollout_events(
        step, revision=plan.revision, drain_timeout_seconds=dep.spec.rollout.drain_timeout_seconds
    )
    if changed:
        events += status_events(previous, status)
    return Decision(
        apply=(*diff.create, *diff.update),
        delete=(*diff.replace, *diff.delete),
        annotate=tuple(annotate),
        status=new_body if changed else None,
        events=tuple(events),
        diff=diff,
        plan=placed,
        heals=heals,
        requeue_after=step.requeue_after,
        rollout=step,
    )


class WorkerTemplates:
    """The update revision's WorkerPlan for any worker index (the planner names and lays out worker
    i the same whatever spec.workers is, so a larger plan of the same spec holds every index)."""

    def __init__(self, dep: OmniDeployment, plan: Plan) -> None:
        self.dep, self.plan = dep, plan

    def worker(self, index: int) -> WorkerPlan:
        if index >= len(self.plan.workers):
            size = max(index + 1, 2 * len(self.plan.workers))
            spec = self.dep.spec.model_copy(update={"workers": size})
            self.plan = plan_deployment(self.dep.model_copy(update={"spec": spec}), target=Target.kubernetes)
        return self.plan.workers[index]


def _worker_of(child: Manifest) -> str | None:
    return (child.get("metadata", {}).get("labels") or {}).get(labels.WORKER)


def _rollout_step(
    *,
    plan: Plan,
    dep: OmniDeployment,
    groups: dict[str, WorkerObjects],
    templates: WorkerTemplates,
    render: RenderFn,
    owner: tuple[str, str],
    now: str,
) -> RolloutStep:
    indexes = sorted({i for n in groups if (i := worker_index(n, deployment=plan.deployment)) is not None})
    targets: dict[str, dict[str, Manifest]] = {}
    if indexes:
        observed_plan = plan.model_copy(update={"workers": tuple(templates.worker(i) for i in indexes)})
        for m in render(observed_plan, owner=owner):
            worker = _worker_of(m)
            if m["kind"] == "Pod" and worker:
                targets.setdefault(worker, {})[m["metadata"]["name"]] = m
    views = [
        view_worker(
            objs,
            deployment=plan.deployment,
            revision=plan.revision,
            targets=targets.get(name, {}),
            routers=plan.router.replicas,
        )
        for name, objs in groups.items()
    ]
    moment = parse_time(now)
    assert moment is not None, f"now={now!r} is not an RFC 3339 time"
    return step_rollout(
        workers=views,
        desired=len(plan.workers),
        revision=plan.revision,
        strategy=Strategy.of(dep.spec.rollout),
        now=moment,
        name_of=lambda i: templates.worker(i).name,
    )


def _annotations(
    *,
    step: RolloutStep,
    groups: dict[str, WorkerObjects],
    table: dict[str, dict[str, str]],
    diff: ChildDiff,
    now: str,
) -> list[Annotate]:
    """Merge patches of worker Services: held workers announce draining (with the time) or their
    readiness; workers rendered at the update revision lose any drain leftovers, and get their state
    written when a server-side apply will not (an earlier merge patch changed it behind the
    applied hash)."""
    out: list[Annotate] = []
    for name, state in step.publish:
        service = groups[name].service
        if service is None:
            continue
        patch: dict[str, str | None] = {labels.WORKER_STATE: state.value}
        if state is WorkerState.draining:
            patch[labels.DRAIN_STARTED] = now
        out.append(Annotate(key_of(service), patch))
    for name in step.hold:
        service = groups[name].service
        annotations = (service or {}).get("metadata", {}).get("annotations") or {}
        if (
            service is not None
            and annotations.get(labels.WORKER_STATE) == WorkerState.draining.value
            and labels.DRAIN_STARTED not in annotations
        ):
            out.append(Annotate(key_of(service), {labels.DRAIN_STARTED: now}))
    applied = {key_of(m) for m in (*diff.create, *diff.update)}
    for name, entry in table.items():
        service = groups[name].service if name in groups else None
        if service is None or is_terminating(service):
            continue
        annotations = service["metadata"].get("annotations") or {}
        cleanup: dict[str, str | None] = {
            k: None for k in annotations if k == labels.DRAIN_STARTED or k.startswith(LIVE_SESSIONS_PREFIX)
        }
        wanted = entry[labels.WORKER_STATE]
        if key_of(service) not in applied and annotations.get(labels.WORKER_STATE) != wanted:
            cleanup[labels.WORKER_STATE] = wanted
        if cleanup:
            out.append(Annotate(key_of(service), cleanup))
    return out


def _invalid(
    message: str, *, generation: int | None, previous: OmniDeploymentStatus | None, body: Manifest, now: str
) -> Decision:
    status = invalid_spec_status(message=message, generation=generation, previous=previous, now=now)
    return _status_only(status, previous=previous, reason=Reason.invalid_spec, message=message)


def reconcile_error_decision(*, body: Manifest, error: BaseException, now: str) -> Decision:
    """What a reconcile pass that raised writes (handlers.py): no child is touched, the status names
    the exception; the same failure again writes nothing."""
    previous = previous_status(body)
    message = error_message(error)
    generation = body.get("metadata", {}).get("generation")
    status = reconcile_error_status(message=message, generation=generation, previous=previous, now=now)
    return _status_only(status, previous=previous, reason=Reason.reconcile_error, message=message)


def _status_only(
    status: OmniDeploymentStatus, *, previous: OmniDeploymentStatus | None, reason: Reason, message: str
) -> Decision:
    new_body = status_body(status)
    if previous is not None and status_body(previous) == new_body:
        return Decision()
    events = status_events(previous, status) or [EventSpec("Warning", reason.value, message)]
    return Decision(status=new_body, events=tuple(events))


def _action_events(
    *, plan: Plan, diff: ChildDiff, observed: Observed, heals: Sequence[Heal]
) -> list[EventSpec]:
    out: list[EventSpec] = []
    existing = {p.worker for p in observed.pods if p.worker}
    created_pods = {m["metadata"]["name"] for m in diff.create if m["kind"] == "Pod"}
    for worker in plan.workers:
        if worker.name not in existing and {p.name for p in worker.pods} <= created_pods:
            out.append(
                EventSpec(
                    "Normal", Reason.worker_created.value, f"worker {worker.name} ({len(worker.pods)} pods)"
                )
            )
    kept = {w.name for w in plan.workers}
    deleted = {k.name for k in diff.delete}
    gone = {p.worker for p in observed.pods if p.worker and p.worker not in kept and p.name in deleted}
    out += [EventSpec("Normal", Reason.worker_deleted.value, f"worker {w} removed") for w in sorted(gone)]
    for heal in heals:
        reason = Reason.worker_recreated if heal.whole_worker else Reason.stage_failed
        out.append(EventSpec("Warning", reason.value, heal.message))
    return out
