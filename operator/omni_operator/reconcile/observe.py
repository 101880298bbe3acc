"""Typed views of what the API server holds, read once from raw objects.

Reconcile decisions look at a handful of fields of each child (labels, phase, conditions, restart
counts, owner); parsing them in one place keeps the rest of reconcile/ free of `dict.get` chains
and makes the raw-object contract explicit and tested.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from omni_operator.api import labels

Manifest = dict[str, Any]
"""A Kubernetes object as a JSON-like dict (what render/ produces and the API server returns)."""


class ChildKey(NamedTuple):
    """Identity of a child object inside one namespace."""

    api_version: str
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


def key_of(obj: Manifest) -> ChildKey:
    return ChildKey(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


def is_terminating(obj: Manifest) -> bool:
    return bool(obj.get("metadata", {}).get("deletionTimestamp"))


def controlled_by(obj: Manifest, uid: str) -> bool:
    """True when `uid` is this object's controller owner (children of other owners are not ours)."""
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid and ref.get("controller") for ref in refs)


@dataclass(frozen=True)
class PodView:
    """The fields of one stage pod that reconcile decisions use."""

    name: str
    worker: str | None
    role: str | None
    worker_revision: str | None
    pod_revision: str | None
    phase: str
    ready: bool
    terminating: bool
    started: bool
    restarts: int
    unschedulable: str | None = None
    """The scheduler's message when the PodScheduled condition says Unschedulable."""
    failure: str | None = None
    """Why the pod failed (phase Failed), for messages."""

    @property
    def running_ready(self) -> bool:
        return self.phase == "Running" and self.ready and not self.terminating


def pod_view(pod: Manifest) -> PodView:
    meta = pod.get("metadata", {})
    lbls = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    status = pod.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    scheduled = conditions.get("PodScheduled") or {}
    unschedulable = None
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        unschedulable = scheduled.get("message") or "unschedulable"
    statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    phase = status.get("phase") or "Pending"
    failure = None
    if phase == "Failed":
        failure = status.get("message") or status.get("reason") or "the pod failed"
    return PodView(
        name=meta["name"],
        worker=lbls.get(labels.WORKER),
        role=lbls.get(labels.ROLE),
        worker_revision=lbls.get(labels.REVISION),
        pod_revision=annotations.get(labels.POD_REVISION),
        phase=phase,
        ready=(conditions.get("Ready") or {}).get("status") == "True",
        terminating=is_terminating(pod),
        started=bool(status.get("startTime")),
        restarts=sum(int(s.get("restartCount") or 0) for s in statuses),
        unschedulable=unschedulable,
        failure=failure,
    )


@dataclass(frozen=True)
class Observed:
    """Every child the deployment controls, as listed from the API server (pods included)."""

    children: tuple[Manifest, ...] = ()

    @property
    def pods(self) -> tuple[PodView, ...]:
        return tuple(pod_view(c) for c in self.children if c.get("kind") == "Pod")

    def by_key(self) -> dict[ChildKey, Manifest]:
        return {key_of(c): c for c in self.children}
