"""pod_view reads exactly the fields reconcile decisions use from raw pods."""

from __future__ import annotations

from reconcile_builders import raw_pod

from omni_operator.reconcile.observe import ChildKey, Observed, PodView, controlled_by, key_of, pod_view


def test_running_ready_pod() -> None:
    pod = raw_pod("qwen-w0-api", worker="qwen-w0", role="api", revision="r1", pod_revision="p1", restarts=2)
    assert pod_view(pod) == PodView(
        name="qwen-w0-api",
        worker="qwen-w0",
        role="api",
        worker_revision="r1",
        pod_revision="p1",
        phase="Running",
        ready=True,
        terminating=False,
        started=True,
        restarts=2,
    )
    assert pod_view(pod).running_ready


def test_unschedulable_pending_pod() -> None:
    message = "0/5 nodes are available: 5 Insufficient nvidia.com/gpu."
    pod = raw_pod("p", phase="Pending", ready=False, unschedulable=message, started=False)
    view = pod_view(pod)
    assert (view.phase, view.ready, view.started, view.unschedulable) == ("Pending", False, False, message)
    assert not view.running_ready


def test_failed_pod_keeps_the_kubelet_message() -> None:
    pod = raw_pod("p", phase="Failed", ready=False)
    pod["status"]["message"] = "OOMKilled"
    assert pod_view(pod).failure == "OOMKilled"


def test_terminating_pod_is_not_running_ready() -> None:
    view = pod_view(raw_pod("p", terminating=True))
    assert view.terminating and not view.running_ready


def test_bare_pod_without_status() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
    assert pod_view(pod) == PodView(
        name="p",
        worker=None,
        role=None,
        worker_revision=None,
        pod_revision=None,
        phase="Pending",
        ready=False,
        terminating=False,
        started=False,
        restarts=0,
    )


def test_keys_and_ownership() -> None:
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "qwen-w0", "ownerReferences": [{"uid": "u1", "controller": True}]},
    }
    assert key_of(svc) == ChildKey("v1", "Service", "qwen-w0")
    assert str(key_of(svc)) == "Service/qwen-w0"
    assert controlled_by(svc, "u1")
    assert not controlled_by(svc, "u2")
    svc["metadata"]["ownerReferences"][0]["controller"] = False
    assert not controlled_by(svc, "u1")


def test_observed_pods_skip_other_kinds() -> None:
    observed = Observed(
        children=(raw_pod("a"), {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}})
    )
    assert [p.name for p in observed.pods] == ["a"]
    assert set(observed.by_key()) == {ChildKey("v1", "Pod", "a"), ChildKey("v1", "Service", "s")}
