"""One reconcile, decided without touching the API server: body + observed children -> writes.

The straight line: parse the spec, plan it, render the desired children, publish each worker's state
on its Service, pick pods to heal, diff desired against observed, compute the status, derive events.
k8s.py carries the decision out; a unit test can call `decide` with plain dicts and compare exactly.
An invalid spec never deletes anything: the children stay as they are and the status says why.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError

from omni_operator.api import labels
from omni_operator.api.load import SpecError, parse_deployments
from omni_operator.api.spec import OmniDeployment
from omni_operator.api.status import OmniDeploymentStatus, Reason
from omni_operator.plan import plan_deployment
from omni_operator.plan.types import Plan, PlanError, Target
from omni_operator.reconcile.diff import ChildDiff, diff_children
from omni_operator.reconcile.events import EventSpec, status_events
from omni_operator.reconcile.observe import ChildKey, Manifest, Observed
from omni_operator.reconcile.rollout import gate_replacements
from omni_operator.reconcile.selfheal import Heal, heal_decisions
from omni_operator.reconcile.status import compute_status, invalid_spec_status, status_body

RenderFn = Callable[..., list[Manifest]]
"""render_manifests(plan, owner=(name, uid)) -> manifests (render/)."""


@dataclass(frozen=True)
class Decision:
    apply: tuple[Manifest, ...] = ()
    """Stamped manifests to server-side apply (creates first, then updates)."""
    delete: tuple[ChildKey, ...] = ()
    """Children to delete (replacements and leftovers)."""
    status: dict | None = None
    """The new status body, or None when it equals the stored one."""
    events: tuple[EventSpec, ...] = ()
    diff: ChildDiff = field(default_factory=ChildDiff)
    plan: Plan | None = None
    heals: tuple[Heal, ...] = ()

    @property
    def writes(self) -> int:
        return len(self.apply) + len(self.delete) + (self.status is not None) + len(self.events)


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

    desired = render(plan, owner=(meta["name"], meta["uid"]))
    pods = observed.pods
    heals = heal_decisions(workers=plan.workers, pods=pods)
    status = compute_status(
        plan=plan,
        pods=pods,
        generation=generation,
        previous=previous,
        now=now,
        endpoint=router_endpoint(desired, plan.namespace),
        selector=scale_selector(plan.deployment),
        progress_deadline_seconds=dep.spec.rollout.progress_deadline_seconds,
    )
    urls = {w.name: w.api_url for w in plan.workers}
    table = {
        w.name: {labels.WORKER_STATE: w.state.value, API_URL: urls[w.name]} for w in status.worker_states
    }
    desired = publish_worker_states(desired, table)
    recreate = [ChildKey("v1", "Pod", name) for heal in heals for name in heal.pods]
    diff = gate_replacements(
        diff_children(desired=desired, observed=observed.children, recreate=recreate),
        rollout=dep.spec.rollout,
    )
    new_body = status_body(status)
    old_body = status_body(previous) if previous is not None else None
    changed = old_body != new_body
    if changed and old_body:
        # A merge patch keeps keys it does not mention: null out the ones that went away.
        new_body |= {key: None for key in old_body if key not in new_body}
    events = [*_action_events(plan=plan, diff=diff, observed=observed, heals=heals)]
    if changed:
        events += status_events(previous, status)
    return Decision(
        apply=(*diff.create, *diff.update),
        delete=(*diff.replace, *diff.delete),
        status=new_body if changed else None,
        events=tuple(events),
        diff=diff,
        plan=plan,
        heals=heals,
    )


def _invalid(
    message: str, *, generation: int | None, previous: OmniDeploymentStatus | None, body: Manifest, now: str
) -> Decision:
    status = invalid_spec_status(message=message, generation=generation, previous=previous, now=now)
    new_body = status_body(status)
    if previous is not None and status_body(previous) == new_body:
        return Decision()
    events = status_events(previous, status) or [EventSpec("Warning", Reason.invalid_spec.value, message)]
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
    gone = {p.worker for p in observed.pods if p.worker and any(k.name == p.name for k in diff.delete)}
    out += [EventSpec("Normal", Reason.worker_deleted.value, f"worker {w} removed") for w in sorted(gone)]
    for heal in heals:
        reason = Reason.worker_recreated if heal.whole_worker else Reason.stage_failed
        out.append(EventSpec("Warning", reason.value, heal.message))
    return out
