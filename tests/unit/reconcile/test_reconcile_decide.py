"""decide end to end on plain dicts: the real planner and renderer, an imagined API server.

Walks one deployment through its life: created, pods come up, idle, scaled down, a thinker fails,
an invalid update. Each step feeds the previous step's writes back as the observed world.
"""

from __future__ import annotations

import copy

from reconcile_builders import NOW, deployment_body

from omni_operator.api import labels
from omni_operator.reconcile.decide import (
    API_URL,
    Decision,
    decide,
    reconcile_error_decision,
    scale_selector,
)
from omni_operator.reconcile.diff import APPLIED_HASH
from omni_operator.reconcile.events import EventSpec
from omni_operator.reconcile.observe import ChildKey, Observed
from omni_operator.render import render_manifests


def stored(manifest: dict, *, running: bool = True) -> dict:
    """What the API server holds after an apply (and after kwok ran the pod)."""
    out = copy.deepcopy(manifest)
    out["metadata"]["uid"] = f"uid-{out['metadata']['name']}"
    if out["kind"] == "Pod":
        out["status"] = {
            "phase": "Running" if running else "Pending",
            "startTime": NOW,
            "conditions": [{"type": "Ready", "status": "True" if running else "False"}],
            "containerStatuses": [{"name": "c", "restartCount": 0}],
        }
    return out


def world_after(decision: Decision, before: list[dict], *, running: bool = True) -> list[dict]:
    by_key = {(o["kind"], o["metadata"]["name"]): o for o in before}
    for key in decision.delete:
        by_key.pop((key.kind, key.name), None)
    for m in decision.apply:
        by_key[(m["kind"], m["metadata"]["name"])] = stored(m, running=running)
    return list(by_key.values())


def step(body: dict, world: list[dict]) -> Decision:
    return decide(body=body, observed=Observed(tuple(world)), now=NOW, render=render_manifests)


def with_status(body: dict, decision: Decision) -> dict:
    return body | {"status": decision.status} if decision.status is not None else body


def service_states(world: list[dict]) -> dict[str, str]:
    return {
        o["metadata"]["name"]: o["metadata"]["annotations"][labels.WORKER_STATE]
        for o in world
        if o["kind"] == "Service" and o["metadata"]["labels"].get(labels.COMPONENT) == "worker"
    }


def test_lifecycle_create_ready_idle() -> None:
    body = deployment_body(workers=2)
    rendered = render_manifests(__import__("reconcile_builders").plan_of(body), owner=("qwen", "uid-1"))
    first = step(body, [])
    assert [(m["kind"], m["metadata"]["name"]) for m in first.apply] == [
        (m["kind"], m["metadata"]["name"]) for m in rendered
    ]
    assert all(APPLIED_HASH in m["metadata"]["annotations"] for m in first.apply)
    assert first.delete == ()
    assert first.status is not None and first.status["phase"] == "Progressing"
    assert first.status["selector"] == scale_selector("qwen")
    assert first.status["endpoint"] == "http://qwen.ns.svc.cluster.local:8000"
    assert list(first.events) == [
        EventSpec("Normal", "WorkerCreated", "worker qwen-w0 (3 pods)"),
        EventSpec("Normal", "WorkerCreated", "worker qwen-w1 (3 pods)"),
    ]
    world = world_after(first, [])
    assert service_states(world) == {"qwen-w0": "starting", "qwen-w1": "starting"}
    urls = {
        o["metadata"]["name"]: o["metadata"]["annotations"][API_URL]
        for o in world
        if o["kind"] == "Service" and o["metadata"]["labels"].get(labels.COMPONENT) == "worker"
    }
    assert urls == {f"qwen-w{i}": f"http://api.qwen-w{i}.ns.svc.cluster.local:8000" for i in range(2)}

    # kwok ran the pods: the workers turn ready, their Services say so, the status follows.
    body = with_status(body, first)
    second = step(body, world)
    assert [(m["kind"], m["metadata"]["name"]) for m in second.apply] == [
        ("Service", "qwen-w0"),
        ("Service", "qwen-w1"),
    ]
    assert second.status is not None and second.status["phase"] == "Ready"
    assert list(second.events) == [EventSpec("Normal", "AllWorkersReady", "2/2 workers ready")]
    world = world_after(second, world)
    assert service_states(world) == {"qwen-w0": "ready", "qwen-w1": "ready"}

    # Nothing changed: nothing is written.
    third = step(with_status(body, second), world)
    assert third == Decision(plan=third.plan)
    assert third.writes == 0


def settled(workers: int) -> tuple[dict, list[dict]]:
    body = deployment_body(workers=workers)
    world: list[dict] = []
    for _ in range(2):
        d = step(body, world)
        world = world_after(d, world)
        body = with_status(body, d)
    return body, world


def test_scale_down_drains_then_deletes_the_last_worker() -> None:
    body, world = settled(2)
    body = copy.deepcopy(body)
    body["spec"]["workers"] = 1
    body["metadata"]["generation"] = 2
    d = step(body, world)
    # The ConfigMap carries the plan, which lists the workers.
    assert [(m["kind"], m["metadata"]["name"]) for m in d.apply] == [("ConfigMap", "qwen-config")]
    # The surplus worker drains first: its Service tells the router, nothing is deleted yet.
    assert d.delete == ()
    assert [(a.key.name, a.annotations) for a in d.annotate] == [
        ("qwen-w1", {labels.WORKER_STATE: "draining", labels.DRAIN_STARTED: NOW})
    ]
    assert EventSpec("Normal", "Scaled", "workers 2 -> 1") in d.events
    world = world_after(d, world)
    for o in world:
        if o["kind"] == "Service" and o["metadata"]["name"] == "qwen-w1":
            o["metadata"]["annotations"] |= d.annotate[0].annotations
            o["metadata"]["annotations"]["live-sessions.omni.dev/r0"] = f'{{"drain": "{NOW}", "sessions": 0}}'
    d = step(with_status(body, d), world)  # every router reports the drain over
    assert d.delete == (
        ChildKey("networking.k8s.io/v1", "NetworkPolicy", "qwen-w1"),
        ChildKey("v1", "Pod", "qwen-w1-api"),
        ChildKey("v1", "Pod", "qwen-w1-talker"),
        ChildKey("v1", "Pod", "qwen-w1-thinker"),
        ChildKey("v1", "Service", "qwen-w1"),
    )
    assert EventSpec("Normal", "WorkerDeleted", "worker qwen-w1 removed") in d.events
    assert d.status is not None and d.status["observedGeneration"] == 2


def test_failed_thinker_recreates_its_worker() -> None:
    body, world = settled(2)
    for o in world:
        if o["metadata"]["name"] == "qwen-w0-thinker":
            o["status"]["phase"] = "Failed"
            o["status"]["message"] = "NCCL timeout"
    d = step(body, world)
    # The worker is no longer ready: its Service tells the router so.
    assert [(m["kind"], m["metadata"]["name"]) for m in d.apply] == [("Service", "qwen-w0")]
    assert d.apply[0]["metadata"]["annotations"][labels.WORKER_STATE] == "starting"
    assert d.delete == (
        ChildKey("v1", "Pod", "qwen-w0-api"),
        ChildKey("v1", "Pod", "qwen-w0-thinker"),
        ChildKey("v1", "Pod", "qwen-w0-talker"),
    )
    assert (
        EventSpec("Warning", "WorkerRecreated", "thinker pod qwen-w0-thinker failed: NCCL timeout")
        in d.events
    )


def test_deleted_pod_and_service_are_recreated() -> None:
    body, world = settled(1)
    world = [
        o
        for o in world
        if o["metadata"]["name"] not in ("qwen-w0-talker",)
        and not (o["kind"] == "Service" and o["metadata"]["name"] == "qwen-w0")
    ]
    d = step(body, world)
    assert sorted((m["kind"], m["metadata"]["name"]) for m in d.apply) == [
        ("Pod", "qwen-w0-talker"),
        ("Service", "qwen-w0"),
    ]
    assert d.delete == ()


def test_invalid_update_touches_no_child() -> None:
    body, world = settled(1)
    body = copy.deepcopy(body)
    body["spec"]["pipeline"] = "text"
    body["spec"]["stages"] = {"talker": {"enabled": True}}
    body["metadata"]["generation"] = 2
    d = step(body, world)
    assert (d.apply, d.delete) == ((), ())
    assert d.status is not None and d.status["phase"] == "Failed"
    message = "spec.stages.talker.enabled: the text pipeline launches no talker; use pipeline: speech, or remove stages.talker.enabled"
    assert [c["message"] for c in d.status["conditions"]] == [message] * 3
    assert d.status["workers"]["ready"] == 1
    # Recomputing the same invalid spec writes nothing more.
    assert step(with_status(body, d), world).writes == 0


def test_a_pass_that_raised_is_reported_once_and_cleared_by_the_next_good_pass() -> None:
    body, world = settled(1)
    assert step(body, world).writes == 0
    failed = reconcile_error_decision(body=body, error=ValueError("renderer bug"), now=NOW)
    assert (failed.apply, failed.delete, failed.annotate) == ((), (), ())
    assert failed.status is not None and failed.status["phase"] == "Degraded"
    assert [(c["type"], c["status"], c["reason"], c["message"]) for c in failed.status["conditions"]] == [
        ("Ready", "False", "ReconcileError", "ValueError: renderer bug"),
        (
            "Progressing",
            "True",
            "NewRevisionAvailable",
            f"1 worker(s) run revision {failed.status['updateRevision']}",
        ),
        ("Degraded", "True", "ReconcileError", "ValueError: renderer bug"),
    ]
    assert list(failed.events) == [
        EventSpec("Warning", "ReconcileError", "ValueError: renderer bug"),
        EventSpec("Warning", "ReconcileError", "ValueError: renderer bug"),
    ]
    failing = with_status(body, failed)
    # The same failure again writes nothing; another one rewrites the message.
    assert reconcile_error_decision(body=failing, error=ValueError("renderer bug"), now=NOW).writes == 0
    other = reconcile_error_decision(body=failing, error=KeyError("talker"), now=NOW)
    assert other.status is not None and other.status["conditions"][0]["message"] == "KeyError: 'talker'"
    assert list(other.events) == [EventSpec("Warning", "ReconcileError", "KeyError: 'talker'")]
    # The next good pass rebuilds the status the normal way, as before the failure.
    healed = step(failing, world)
    assert healed.status == body["status"]
    assert list(healed.events) == [EventSpec("Normal", "AllWorkersReady", "1/1 workers ready")]
