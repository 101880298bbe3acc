"""Smoke tests of the test control plane itself: GPU pods schedule and run on kwok nodes, an
impossible GPU request stays Pending for the reason the operator will have to report."""

from __future__ import annotations

import pytest
from e2e_cluster import ControlPlane, wait_for
from e2e_nodes import GPU_RESOURCE

pytestmark = pytest.mark.e2e


def gpu_pod(name: str, gpus: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "example.invalid/never-pulled:1",
                    "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
                }
            ]
        },
    }


def test_nodes_advertise_gpus(control_plane: ControlPlane) -> None:
    with control_plane.https() as client:
        nodes = {n["metadata"]["name"]: n for n in client.get("/api/v1/nodes").json()["items"]}
    gpu_nodes = sorted(name for name, n in nodes.items() if GPU_RESOURCE in n["status"]["allocatable"])
    assert gpu_nodes == ["kwok-gpu-0", "kwok-gpu-1", "kwok-gpu-2", "kwok-gpu-3"]
    for name in gpu_nodes:
        assert nodes[name]["status"]["allocatable"][GPU_RESOURCE] == "8"
        assert nodes[name]["metadata"]["labels"]["omni.dev/gpu-tier"] == "h100"


def test_two_gpu_pod_runs_and_nine_gpu_pod_is_unschedulable(
    control_plane: ControlPlane, namespace: str
) -> None:
    with control_plane.https() as client:
        base = f"/api/v1/namespaces/{namespace}/pods"
        assert client.post(base, json=gpu_pod("two", 2)).status_code == 201
        assert client.post(base, json=gpu_pod("nine", 9)).status_code == 201

        def running() -> bool:
            pod = client.get(f"{base}/two").json()
            return pod["status"].get("phase") == "Running"

        wait_for("pod two Running", running, timeout=60)
        two = client.get(f"{base}/two").json()
        assert two["spec"]["nodeName"].startswith("kwok-gpu-")
        assert {c["type"]: c["status"] for c in two["status"]["conditions"]}["Ready"] == "True"

        def unschedulable() -> bool:
            conds = client.get(f"{base}/nine").json()["status"].get("conditions", [])
            return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conds)

        wait_for("pod nine Unschedulable", unschedulable, timeout=60)
        nine = client.get(f"{base}/nine").json()
        assert nine["status"]["phase"] == "Pending"
        assert "nodeName" not in nine["spec"]
        (scheduled,) = [c for c in nine["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert f"Insufficient {GPU_RESOURCE}" in scheduled["message"]


def test_kubectl_talks_to_the_cluster(control_plane: ControlPlane) -> None:
    out = control_plane.kubectl("get", "nodes", "-l", "omni.dev/gpu-tier=h100", "-o", "name").stdout.split()
    assert out == ["node/kwok-gpu-0", "node/kwok-gpu-1", "node/kwok-gpu-2", "node/kwok-gpu-3"]
