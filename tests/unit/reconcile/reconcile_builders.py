"""Fluent builders for reconcile table tests: OmniDeployment bodies and raw pods as the API server
returns them, so tests read like the objects they describe."""

from __future__ import annotations

from typing import Any

from omni_operator.api import labels
from omni_operator.api.load import parse_deployments
from omni_operator.plan import Plan, plan_deployment

NOW = "2026-01-01T00:10:00Z"
EARLIER = "2026-01-01T00:00:00Z"


def deployment_body(
    name: str = "qwen",
    *,
    workers: int = 2,
    generation: int = 1,
    uid: str = "uid-1",
    status: dict | None = None,
    spec: dict | None = None,
) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"name": "Qwen2.5-Omni-7B", "path": "/models/qwen"},
        "pipeline": "speech",
        "workers": workers,
        "gpu": {"tier": "h100"},
    }
    base.update(spec or {})
    body = {
        "apiVersion": "omni.dev/v1alpha1",
        "kind": "OmniDeployment",
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "generation": generation},
        "spec": base,
    }
    if status is not None:
        body["status"] = status
    return body


def plan_of(body: dict[str, Any]) -> Plan:
    import json

    return plan_deployment(parse_deployments(json.dumps(body))[0])


def raw_pod(
    name: str,
    *,
    worker: str | None = None,
    role: str | None = None,
    revision: str | None = None,
    pod_revision: str | None = None,
    phase: str = "Running",
    ready: bool = True,
    restarts: int = 0,
    terminating: bool = False,
    unschedulable: str | None = None,
    started: bool = True,
) -> dict[str, Any]:
    lbls = {labels.DEPLOYMENT: "qwen"}
    if worker:
        lbls[labels.WORKER] = worker
    if role:
        lbls[labels.ROLE] = role
    if revision:
        lbls[labels.REVISION] = revision
    meta: dict[str, Any] = {"name": name, "labels": lbls, "annotations": {}}
    if pod_revision:
        meta["annotations"][labels.POD_REVISION] = pod_revision
    if terminating:
        meta["deletionTimestamp"] = EARLIER
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if unschedulable:
        conditions.append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}
        )
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": conditions,
        "containerStatuses": [{"name": "main", "restartCount": restarts}],
    }
    if started:
        status["startTime"] = EARLIER
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": status}


def pods_of(plan: Plan, **overrides: Any) -> list[dict[str, Any]]:
    """Every planned pod, Running and Ready at its planned revision (overrides apply to all)."""
    out = []
    for worker in plan.workers:
        for pod in worker.pods:
            kwargs = {
                "worker": worker.name,
                "role": pod.role.value,
                "revision": worker.revision,
                "pod_revision": pod.revision,
            } | overrides
            out.append(raw_pod(pod.name, **kwargs))
    return out
