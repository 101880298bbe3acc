"""Observed children grouped into workers, and each worker read as the rollout needs it.

A worker is every child labelled with its name: the headless Service (which tells the router the
worker's revision and state), its NetworkPolicy and its stage pods. Whether a pod still matches the
update revision is judged by a *template hash*: a hash of the rendered pod with the worker revision
masked out, stamped on every pod the operator creates (TEMPLATE_HASH). Two revisions that differ
only in the talker give equal template hashes for the api and thinker pods, so only the talker pod
is replaced; a change outside the containers (node selector, volumes) changes every pod's hash,
which the planner's own pod revision would miss.

Router session reports: each router replica may annotate a draining worker's Service with
`live-sessions.omni.dev/<replica>: {"drain": "<the omni.dev/drain-started value it saw>",
"sessions": N}`. A drain is over early when at least spec.router.replicas reports name this drain
and all say 0 (the drain value makes stale reports harmless and needs no clock agreement).
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from omni_operator.api import labels
from omni_operator.api.status import WorkerState
from omni_operator.reconcile.diff import APPLIED_HASH, applied_hash, manifest_hash
from omni_operator.reconcile.observe import Manifest, is_terminating, pod_view
from omni_operator.reconcile.rollout import ObservedWorker

TEMPLATE_HASH = f"{labels.PREFIX}/template-hash"
"""Annotation on stage pods: hash of the pod's template with the worker revision masked."""
LIVE_SESSIONS_PREFIX = "live-sessions.omni.dev/"
"""Annotation key prefix on a worker's Service: one router replica's session report."""


def template_hash(pod: Manifest, *, revision: str) -> str:
    body = copy.deepcopy(pod)
    annotations = body.get("metadata", {}).get("annotations") or {}
    for key in (APPLIED_HASH, TEMPLATE_HASH):
        annotations.pop(key, None)
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    if revision:
        canonical = canonical.replace(revision, "{revision}")
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def with_template_hash(manifests: Iterable[Manifest], *, revision: str) -> list[Manifest]:
    """`manifests` with TEMPLATE_HASH on every Pod (copies; other kinds pass through)."""
    out = []
    for m in manifests:
        if m["kind"] == "Pod":
            m = copy.deepcopy(m)
            m["metadata"].setdefault("annotations", {})[TEMPLATE_HASH] = template_hash(m, revision=revision)
        out.append(m)
    return out


def worker_index(name: str, *, deployment: str) -> int | None:
    """`{deployment}-w{i}` -> i (plan/layout.py names workers so); None for any other name."""
    match = re.fullmatch(re.escape(deployment) + r"-w(\d+)", name)
    return int(match.group(1)) if match else None


def parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


@dataclass
class WorkerObjects:
    name: str
    service: Manifest | None = None
    pods: list[Manifest] = field(default_factory=list)
    others: list[Manifest] = field(default_factory=list)

    @property
    def children(self) -> list[Manifest]:
        return [*([self.service] if self.service else []), *self.pods, *self.others]


def group_workers(children: Iterable[Manifest]) -> dict[str, WorkerObjects]:
    out: dict[str, WorkerObjects] = {}
    for child in children:
        name = (child.get("metadata", {}).get("labels") or {}).get(labels.WORKER)
        if not name:
            continue
        objs = out.setdefault(name, WorkerObjects(name))
        if child["kind"] == "Pod":
            objs.pods.append(child)
        elif child["kind"] == "Service" and objs.service is None:
            objs.service = child
        else:
            objs.others.append(child)
    return out


def live_sessions(annotations: Mapping[str, str], *, drain: str | None, routers: int) -> int | None:
    """Sessions the routers report for this drain: 0 only when `routers` reports all say so."""
    if not drain:
        return None
    counts = []
    for key, value in annotations.items():
        if not key.startswith(LIVE_SESSIONS_PREFIX):
            continue
        try:
            report = json.loads(value)
            if report.get("drain") == drain:
                counts.append(int(report["sessions"]))
        except (ValueError, TypeError, KeyError, AttributeError):
            continue  # a malformed report is no report: the drain timeout still bounds the wait
    if any(c > 0 for c in counts):
        return sum(c for c in counts if c > 0)
    return 0 if counts and len(counts) >= routers else None


def _stale(pod: Manifest, target: Manifest | None, *, revision: str) -> bool:
    if target is None:
        return True
    stamped = (pod.get("metadata", {}).get("annotations") or {}).get(TEMPLATE_HASH)
    if stamped is not None:
        return stamped != template_hash(target, revision=revision)
    # Created before template hashes existed: unchanged only when applied exactly as rendered now.
    return applied_hash(pod) != manifest_hash(target)


def view_worker(
    objs: WorkerObjects,
    *,
    deployment: str,
    revision: str,
    targets: Mapping[str, Manifest],
    routers: int,
) -> ObservedWorker:
    """`targets`: the update revision's pods for this worker's index, by name (unstamped)."""
    live_pods = [p for p in objs.pods if not is_terminating(p)]
    service = objs.service if objs.service is not None and not is_terminating(objs.service) else None
    stale = tuple(
        sorted(
            p["metadata"]["name"]
            for p in live_pods
            if _stale(p, targets.get(p["metadata"]["name"]), revision=revision)
        )
    )
    if service is not None:
        svc_meta = service["metadata"]
        annotations = svc_meta.get("annotations") or {}
        worker_revision = (svc_meta.get("labels") or {}).get(labels.REVISION)
        raw_state = annotations.get(labels.WORKER_STATE, WorkerState.ready.value)  # the router's default
        published = WorkerState(raw_state) if raw_state in WorkerState._value2member_map_ else None
        drain = annotations.get(labels.DRAIN_STARTED)
    else:
        annotations, drain, published = {}, None, None
        pod_revisions = {(p["metadata"].get("labels") or {}).get(labels.REVISION) for p in live_pods}
        worker_revision = (
            revision if not stale and live_pods else next(iter(sorted(map(str, pod_revisions))), None)
        )
    current = worker_revision == revision and not stale
    expected = set(targets) if current else {p["metadata"]["name"] for p in live_pods}
    views = {p["metadata"]["name"]: pod_view(p) for p in live_pods}
    ready = (
        bool(expected)
        and all(name in views and views[name].running_ready for name in expected)
        and len(live_pods) == len(objs.pods)
    )
    created = [parse_time(p["metadata"].get("creationTimestamp")) for p in live_pods]
    return ObservedWorker(
        name=objs.name,
        index=worker_index(objs.name, deployment=deployment),
        revision=worker_revision,
        stale_pods=stale,
        ready=ready,
        published=published,
        drain_started=parse_time(drain),
        sessions=live_sessions(annotations, drain=drain, routers=routers)
        if published is WorkerState.draining
        else None,
        # The deadline clock starts once every pod exists (an in-place update keeps old pods).
        since=max((c for c in created if c is not None), default=None) if expected <= set(views) else None,
        terminating=not live_pods and service is None,
    )
