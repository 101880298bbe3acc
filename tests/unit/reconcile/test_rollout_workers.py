"""workers.py: template hashes, router session reports, and one worker read from raw objects."""

from __future__ import annotations

import datetime as dt
import json

from reconcile_builders import deployment_body, plan_of, raw_pod

from omni_operator.api import labels
from omni_operator.api.status import WorkerState
from omni_operator.reconcile.workers import (
    TEMPLATE_HASH,
    WorkerObjects,
    group_workers,
    live_sessions,
    template_hash,
    view_worker,
    with_template_hash,
    worker_index,
)
from omni_operator.render import render_manifests


def pods_by_role(body: dict) -> tuple[str, dict[str, dict]]:
    plan = plan_of(body)
    pods = {
        m["metadata"]["name"].rsplit("-", 1)[1]: m
        for m in render_manifests(plan)
        if m["kind"] == "Pod" and m["metadata"]["name"].startswith("qwen-w0-")
    }
    return plan.revision, pods


def test_template_hash_sees_only_the_pods_that_really_changed() -> None:
    rev0, before = pods_by_role(deployment_body(workers=1))
    rev1, after = pods_by_role(deployment_body(workers=1, spec={"stages": {"talker": {"image": "t:2"}}}))
    assert rev0 != rev1
    same = {
        role: template_hash(before[role], revision=rev0) == template_hash(after[role], revision=rev1)
        for role in before
    }
    assert same == {"api": True, "thinker": True, "talker": False}
    # A scheduling change is outside the containers, yet it changes every GPU pod.
    rev2, moved = pods_by_role(
        deployment_body(workers=1, spec={"gpu": {"tier": "h100", "nodeSelector": {"a": "b"}}})
    )
    same = {
        role: template_hash(before[role], revision=rev0) == template_hash(moved[role], revision=rev2)
        for role in before
    }
    assert same == {"api": True, "thinker": False, "talker": False}


def test_stamping_adds_the_hash_to_pods_only_and_copies() -> None:
    rev, pods = pods_by_role(deployment_body(workers=1))
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}
    out = with_template_hash([pods["talker"], service], revision=rev)
    assert out[0]["metadata"]["annotations"][TEMPLATE_HASH] == template_hash(pods["talker"], revision=rev)
    assert TEMPLATE_HASH not in pods["talker"]["metadata"]["annotations"]
    assert out[1] is service
    assert template_hash(out[0], revision=rev) == template_hash(pods["talker"], revision=rev)


def test_worker_index_follows_the_planner_names() -> None:
    assert [
        worker_index(n, deployment="qwen") for n in ("qwen-w0", "qwen-w12", "qwen-w", "other-w1", "qwen-w1x")
    ] == [
        0,
        12,
        None,
        None,
        None,
    ]


def report(drain: str, sessions: object) -> str:
    return json.dumps({"drain": drain, "sessions": sessions})


def test_live_sessions_need_every_router_to_report_this_drain() -> None:
    d = "2026-01-01T00:00:00Z"
    key = "live-sessions.omni.dev/"
    assert live_sessions({key + "a": report(d, 0)}, drain=d, routers=2) is None
    assert live_sessions({key + "a": report(d, 0), key + "b": report(d, 0)}, drain=d, routers=2) == 0
    assert live_sessions({key + "a": report(d, 3), key + "b": report(d, 1)}, drain=d, routers=2) == 4
    assert live_sessions({key + "a": report(d, 2)}, drain=d, routers=2) == 2  # known > 0 is enough
    assert live_sessions({key + "a": report("older", 0)}, drain=d, routers=1) is None
    assert live_sessions({key + "a": "not json", key + "b": report(d, "x")}, drain=d, routers=1) is None
    assert live_sessions({"other/a": report(d, 0)}, drain=d, routers=1) is None
    assert live_sessions({key + "a": report(d, 0)}, drain=None, routers=1) is None


def service(state: str | None, revision: str, **annotations: str) -> dict:
    ann = {labels.WORKER_STATE: state, **annotations} if state else dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "qwen-w0",
            "labels": {labels.WORKER: "qwen-w0", labels.REVISION: revision},
            "annotations": ann,
        },
    }


def stored_pods(plan_body: dict, revision_label: str) -> tuple[str, dict[str, dict], list[dict]]:
    rev, pods = pods_by_role(plan_body)
    stamped = with_template_hash(pods.values(), revision=rev)
    out = []
    for m in stamped:
        m = json.loads(json.dumps(m))
        m["metadata"]["labels"][labels.REVISION] = revision_label
        m["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
        m["status"] = raw_pod("x")["status"]
        out.append(m)
    return rev, {m["metadata"]["name"]: m for m in pods.values()}, out


def test_view_of_an_old_serving_worker_names_its_stale_pod() -> None:
    _, _, old = stored_pods(deployment_body(workers=1), "r0")
    rev1, targets, _ = stored_pods(
        deployment_body(workers=1, spec={"stages": {"talker": {"image": "t:2"}}}), "r1"
    )
    drain = "2026-01-01T00:05:00Z"
    objs = group_workers([service("draining", "r0", **{labels.DRAIN_STARTED: drain}), *old])["qwen-w0"]
    view = view_worker(objs, deployment="qwen", revision=rev1, targets=targets, routers=1)
    assert view.name == "qwen-w0" and view.index == 0
    assert (view.revision, view.stale_pods, view.ready) == ("r0", ("qwen-w0-talker",), True)
    assert (view.published, view.sessions) == (WorkerState.draining, None)
    assert view.drain_started == dt.datetime(2026, 1, 1, 0, 5, tzinfo=dt.UTC)
    assert view.since == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert not view.current(rev1) and not view.terminating


def test_view_of_a_current_worker_missing_a_pod_has_no_deadline_clock_yet() -> None:
    rev, targets, stored = stored_pods(deployment_body(workers=1), "ignored")
    without_talker = [p for p in stored if not p["metadata"]["name"].endswith("talker")]
    objs = WorkerObjects("qwen-w0", service=service("starting", rev), pods=without_talker)
    view = view_worker(objs, deployment="qwen", revision=rev, targets=targets, routers=1)
    assert view.current(rev) and not view.ready and view.since is None
    # No Service and only terminating pods: the worker is going away.
    for p in stored:
        p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:01Z"
    gone = view_worker(
        WorkerObjects("qwen-w0", pods=stored), deployment="qwen", revision=rev, targets=targets, routers=1
    )
    assert gone.terminating and gone.published is None


def test_a_service_without_a_state_counts_as_ready_like_the_router_reads_it() -> None:
    rev, targets, stored = stored_pods(deployment_body(workers=1), "x")
    objs = WorkerObjects("qwen-w0", service=service(None, rev), pods=stored)
    assert (
        view_worker(objs, deployment="qwen", revision=rev, targets=targets, routers=1).published
        is WorkerState.ready
    )
