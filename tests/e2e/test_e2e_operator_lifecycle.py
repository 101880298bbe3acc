"""The operator on the real control plane: apply, schedule, ready, idle, scale, delete, self-heal.

kwok runs the pods (no kubelet, no images): a pod is Ready as soon as it is bound to a node, so
worker readiness here comes from the pods' Ready condition, exactly what the operator reads.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
import yaml
from e2e_cluster import ControlPlane, wait_for
from e2e_operator import Api, condition, deployment, gpu_request, running_operator, uids

from omni_operator.api import labels
from omni_runtime.router.k8s_source import KubernetesSource

pytestmark = pytest.mark.e2e

SELECTOR = "omni.dev/deployment={name},omni.dev/component=worker,omni.dev/role in (api,worker)"


def resource_versions(api: Api, name: str) -> dict[str, str]:
    groups = {"OmniDeployment": [api.get(name)], "Pod": api.pods(name), "Service": api.services(name)}
    return {
        f"{kind}/{o['metadata']['name']}": o["metadata"]["resourceVersion"]
        for kind, objs in groups.items()
        for o in objs
        if o
    }


def test_apply_schedules_gpu_pods_and_reports_ready(
    crds: ControlPlane, api: Api, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_operator(crds, namespace, args=("--resync-seconds", "2")) as op:
        crds.kubectl(
            "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(deployment("omni", workers=2, tp=2))
        )
        status = api.wait_ready("omni", 2)

        pods = {p["metadata"]["name"]: p for p in api.pods("omni")}
        assert sorted(pods) == [
            f"omni-w{i}-{role}" for i in range(2) for role in ("api", "talker", "thinker")
        ]
        assert {n: gpu_request(p) for n, p in pods.items()} == {
            f"omni-w{i}-{role}": gpus
            for i in range(2)
            for role, gpus in (("api", 0), ("talker", 1), ("thinker", 2))
        }
        per_node = Counter()
        for p in pods.values():
            assert p["spec"]["nodeName"], p["metadata"]["name"]
            per_node[p["spec"]["nodeName"]] += gpu_request(p)
            assert {c["type"]: c["status"] for c in p["status"]["conditions"]}["Ready"] == "True"
        for node, gpus in per_node.items():
            if gpus:
                assert node.startswith("kwok-gpu-") and gpus <= 8, (node, gpus)

        assert status["observedGeneration"] == 1
        assert status["workers"] == {"desired": 2, "ready": 2, "updated": 2, "available": 2}
        assert status["replicas"] == 2
        assert set(status["stages"]) == {
            "preprocessing",
            "audio_encoder",
            "image_encoder",
            "mm_aggregate",
            "thinker",
            "decode",
            "talker",
        }
        assert all(s == {"desired": 2, "ready": 2} for s in status["stages"].values())
        assert status["endpoint"] == f"http://omni.{namespace}.svc.cluster.local:8000"
        assert status["selector"] == SELECTOR.format(name="omni")
        assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
            ("Ready", "True", "AllWorkersReady"),
            ("Progressing", "True", "NewRevisionAvailable"),
            ("Degraded", "False", "Reconciled"),
        ]
        assert [w["state"] for w in status["workerStates"]] == ["ready", "ready"]

        # The worker table for the router: each worker's headless Service carries its state.
        wait_for(
            "worker Services annotated ready",
            lambda: (
                {
                    s["metadata"]["name"]: (s["metadata"].get("annotations") or {}).get(labels.WORKER_STATE)
                    for s in api.services("omni")
                    if s["metadata"]["labels"].get(labels.COMPONENT) == "worker"
                }
                == {"omni-w0": "ready", "omni-w1": "ready"}
            ),
            timeout=30,
        )

        # ... and the router's Kubernetes source reads exactly that table.
        # (the client reads $KUBECONFIG once, at import: point its default at our kubeconfig instead)
        monkeypatch.setattr(
            "kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(crds.kubeconfig)
        )
        specs = KubernetesSource(namespace=namespace, deployment="omni").load()
        assert [(w.id, w.url, w.revision, w.state.value) for w in specs] == [
            (
                f"omni-w{i}",
                f"http://api.omni-w{i}.{namespace}.svc.cluster.local:8000",
                status["updateRevision"],
                "ready",
            )
            for i in range(2)
        ]

        table = crds.kubectl("get", "omnideployments", "-n", namespace).stdout.splitlines()
        assert table[0].split() == ["NAME", "WORKERS", "READY", "PHASE", "ENDPOINT", "AGE"]
        assert table[1].split()[:5] == [
            "omni",
            "2",
            "2",
            "Ready",
            f"http://omni.{namespace}.svc.cluster.local:8000",
        ]

        reasons = Counter(
            e["reason"] for e in api.events() if e["involvedObject"]["kind"] == "OmniDeployment"
        )
        assert reasons["WorkerCreated"] == 2 and reasons["AllWorkersReady"] == 1

        # Idle: resyncs every 2 s observe an unchanged world and write nothing at all.
        wait_for("status settled", lambda: len(op.reconcile_lines("omni")) > 0, timeout=10)
        time.sleep(3)
        before, seen = resource_versions(api, "omni"), len(op.reconcile_lines("omni"))
        wait_for("3 more reconciles", lambda: len(op.reconcile_lines("omni")) >= seen + 3, timeout=30)
        assert resource_versions(api, "omni") == before
        idle = op.reconcile_lines("omni")[seen:]
        assert all(" 0 writes " in line for line in idle), idle


def test_scale_by_spec_and_by_scale_subresource(crds: ControlPlane, api: Api, namespace: str) -> None:
    with running_operator(crds, namespace):
        api.create(deployment("scaled", workers=1, spec={"rollout": {"drainTimeoutSeconds": 1}}))
        api.wait_ready("scaled", 1)
        api.patch_spec("scaled", {"workers": 3})
        status = api.wait_ready("scaled", 3)
        assert status["observedGeneration"] == 2
        assert len(api.pods("scaled")) == 9

        crds.kubectl("scale", "-n", namespace, "omnideployment/scaled", "--replicas=1")
        api.wait_status(
            "scaled",
            "scaled down to 1",
            lambda st: (
                st.get("phase") == "Ready" and st["workers"]["desired"] == 1 and st.get("replicas") == 1
            ),
        )
        wait_for("surplus pods gone", lambda: len(api.pods("scaled")) == 3, timeout=60)
        assert sorted(p["metadata"]["name"] for p in api.pods("scaled")) == [
            "scaled-w0-api",
            "scaled-w0-talker",
            "scaled-w0-thinker",
        ]
        scale = api.client.get(
            f"/apis/omni.dev/v1alpha1/namespaces/{namespace}/omnideployments/scaled/scale"
        ).json()
        assert scale["spec"]["replicas"] == 1
        assert scale["status"] == {"replicas": 1, "selector": SELECTOR.format(name="scaled")}
        worker_services = [
            s for s in api.services("scaled") if s["metadata"]["labels"].get(labels.COMPONENT) == "worker"
        ]
        assert [s["metadata"]["name"] for s in worker_services] == ["scaled-w0"]


def test_delete_garbage_collects_every_child(crds: ControlPlane, api: Api, namespace: str) -> None:
    with running_operator(crds, namespace):
        api.create(deployment("doomed", workers=2))
        api.wait_ready("doomed", 2)
        crds.kubectl("delete", "-n", namespace, "omnideployment/doomed", "--wait=false")
        wait_for("OmniDeployment gone", lambda: api.get("doomed") is None, timeout=30)

    selector = f"{labels.DEPLOYMENT}=doomed"
    kinds = [
        "/api/v1/namespaces/{ns}/pods",
        "/api/v1/namespaces/{ns}/services",
        "/api/v1/namespaces/{ns}/configmaps",
        "/api/v1/namespaces/{ns}/serviceaccounts",
        "/apis/apps/v1/namespaces/{ns}/deployments",
        "/apis/apps/v1/namespaces/{ns}/replicasets",
        "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
        "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
        "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
        "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    ]
    wait_for(
        "garbage collector removed every child",
        lambda: all(not api.items(path, selector) for path in kinds),
        timeout=90,
    )


def test_deleted_children_and_failed_thinker_are_healed(crds: ControlPlane, api: Api, namespace: str) -> None:
    with running_operator(crds, namespace):
        api.create(deployment("heal", workers=2))
        api.wait_ready("heal", 2)
        pods, services = uids(api.pods("heal")), uids(api.services("heal"))

        api.client.delete(f"/api/v1/namespaces/{namespace}/pods/heal-w0-talker")
        api.client.delete(f"/api/v1/namespaces/{namespace}/services/heal-w0")

        def recreated() -> bool:
            now_pods, now_services = uids(api.pods("heal")), uids(api.services("heal"))
            return now_pods.get("heal-w0-talker") not in (None, pods["heal-w0-talker"]) and now_services.get(
                "heal-w0"
            ) not in (None, services["heal-w0"])

        wait_for("deleted pod and service recreated", recreated, timeout=60)
        api.wait_ready("heal", 2)
        after = uids(api.pods("heal"))
        assert {n: u for n, u in after.items() if n != "heal-w0-talker"} == {
            n: u for n, u in pods.items() if n != "heal-w0-talker"
        }

        # A failed thinker rank takes its whole worker down and back up; the other worker is untouched.
        r = api.client.patch(
            f"/api/v1/namespaces/{namespace}/pods/heal-w1-thinker/status",
            json={"status": {"phase": "Failed", "message": "NCCL watchdog timeout"}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert r.status_code == 200, r.text

        def worker_replaced() -> bool:
            now = uids(api.pods("heal"))
            return len(now) == 6 and all(
                now[f"heal-w1-{r}"] != after[f"heal-w1-{r}"] for r in ("api", "thinker", "talker")
            )

        wait_for("worker heal-w1 recreated whole", worker_replaced, timeout=60)
        api.wait_ready("heal", 2)
        final = uids(api.pods("heal"))
        assert {n: final[n] for n in final if n.startswith("heal-w0")} == {
            n: after[n] for n in after if n.startswith("heal-w0")
        }
        messages = [e["message"] for e in api.events() if e["reason"] == "WorkerRecreated"]
        assert messages == ["thinker pod heal-w1-thinker failed: NCCL watchdog timeout"]
        assert condition(api.get("heal")["status"], "Ready")["status"] == "True"
