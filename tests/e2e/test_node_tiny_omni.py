"""The README's Kubernetes path on a real node: real containers, real traffic.

`helm install` runs the operator image `make images` built as a pod with the chart's
ServiceAccount; `examples/tiny-cpu.yaml` is applied as it is and becomes Ready: worker and router
pods run the runtime image under runc, on the pod network, behind Services that kube-proxy
implements, found through CoreDNS. Then traffic: the `openai` package from a client pod, a worker
pod deleted mid-session, a rolling image upgrade under a live session, and deletion. The tests
share one deployment and run in file order (each leaves it Ready with two workers).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_cluster import ControlPlane, wait_for
from e2e_node import RealNode
from e2e_operator import Api
from node_client import realtime_turn
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families
from test_helm_install import CHART, RELEASE, RESTRICTED, SA, Tools, create_namespace, delete_namespace
from websockets.exceptions import ConnectionClosed

from omni_operator.api import labels

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tiny-cpu.yaml"
CLIENT_IMAGE = "localhost/omni-e2e-client:1"
GRACE = 30  # the worker pods' terminationGracePeriodSeconds (the Kubernetes default)
READY_TIMEOUT = 900  # two workers import torch and write the tiny checkpoint on 2 shared cores


@dataclass
class Deployed:
    cp: ControlPlane
    node: RealNode
    ns: str
    api: Api
    tools: Tools
    name: str
    image: str

    def router_url(self) -> str:
        """The router Service's cluster IP: kube-proxy's rules serve this host too."""
        service = self.api.client.get(f"/api/v1/namespaces/{self.ns}/services/{self.name}").json()
        return f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"

    def workers(self) -> dict[str, dict[str, float]]:
        """The router's view per worker, from its /metrics (the admin API answers on loopback
        only): live sessions and whether the worker is in rotation."""
        text = httpx.get(f"{self.router_url()}/metrics", timeout=10).text
        view: dict[str, dict[str, float]] = {}
        for family in text_string_to_metric_families(text):
            if family.name in ("omni_router_sessions", "omni_router_worker_in_rotation"):
                for sample in family.samples:
                    key = "sessions" if family.name == "omni_router_sessions" else "in_rotation"
                    view.setdefault(sample.labels["worker"], {})[key] = sample.value
        return view

    def wait_two_workers_in_rotation(self, timeout: float = READY_TIMEOUT) -> None:
        self.api.wait_ready(self.name, workers=2, timeout=timeout)

        def in_rotation() -> bool:
            return sum(1 for w in self.workers().values() if w.get("in_rotation")) == 2

        wait_for("two workers in the router's rotation", in_rotation, timeout=120)


@pytest.fixture(scope="module")
def deployed(
    node_cluster: tuple[ControlPlane, RealNode], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployed]:
    cp, node = node_cluster
    tools = Tools(cp, tmp_path_factory.mktemp("node-helm-home"))
    ns = create_namespace(cp, RESTRICTED)
    api = Api(cp, ns)
    try:
        tools.helm("install", RELEASE, str(CHART), "--namespace", ns, "--wait", "--timeout", "300s")
        body = yaml.safe_load(EXAMPLE.read_text())
        api.create(body)
        d = Deployed(cp, node, ns, api, tools, body["metadata"]["name"], body["spec"]["runtime"]["image"])
        d.wait_two_workers_in_rotation()
        yield d
    finally:
        tools.helm("uninstall", RELEASE, "--namespace", ns, "--wait", "--timeout", "60s", check=False)
        api.close()
        delete_namespace(cp, ns)


def pods(d: Deployed, selector: str) -> list[dict[str, Any]]:
    return d.api.items("/api/v1/namespaces/{ns}/pods", selector)


def test_operator_runs_from_the_chart_and_workers_are_real_containers(deployed: Deployed) -> None:
    operators = pods(deployed, "app.kubernetes.io/name=omni-operator")
    assert operators and all(p["spec"]["serviceAccountName"] == SA for p in operators)
    assert all(p["status"]["phase"] == "Running" for p in operators)
    workers = deployed.api.pods(deployed.name)
    assert len(workers) == 2
    for pod in workers:
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] and status["containerID"].startswith("containerd://")
        assert status["image"].endswith(deployed.image.split("/", 1)[1])
        assert pod["spec"]["nodeName"] == deployed.node.name
        assert pod["status"]["podIP"].startswith("10.244.")
    status = deployed.api.get(deployed.name)["status"]  # type: ignore[index]
    assert status["phase"] == "Ready" and status["workers"]["ready"] == 2


def test_client_pod_chats_and_speaks_through_the_router_service(deployed: Deployed) -> None:
    """From a pod: the router's DNS name, chat text, SSE speech and a realtime turn."""
    script = (Path(__file__).parent / "node_client.py").read_text()
    url = f"http://{deployed.name}.{deployed.ns}.svc.cluster.local:8000"
    objects = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "client-script"},
            "data": {"node_client.py": script},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "client"},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [
                    {
                        "name": "client",
                        "image": CLIENT_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["python", "/client/node_client.py", url],
                        "volumeMounts": [{"name": "script", "mountPath": "/client"}],
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }
                ],
                "volumes": [{"name": "script", "configMap": {"name": "client-script"}}],
            },
        },
    ]
    deployed.tools.kubectl("apply", "-n", deployed.ns, "-f", "-", input=yaml.safe_dump_all(objects))
    path = f"/api/v1/namespaces/{deployed.ns}/pods/client"

    def finished() -> bool:
        return deployed.api.client.get(path).json()["status"]["phase"] in ("Succeeded", "Failed")

    wait_for("the client pod to finish", finished, timeout=600)
    logs = deployed.tools.kubectl("logs", "-n", deployed.ns, "client").stdout
    phase = deployed.api.client.get(path).json()["status"]["phase"]
    assert phase == "Succeeded", logs
    result = json.loads(logs.strip().splitlines()[-1])
    assert result["chat"]["text"] and result["chat"]["completion_tokens"] >= 1
    assert result["chat"]["sse_audio_chunks"] >= 1 and result["chat"]["sse_audio_ids"] == 1
    assert result["chat"]["sse_rates"] == [24000]
    assert result["realtime"]["status"] in ("completed", "incomplete"), result["realtime"]
    assert result["realtime"]["audio_bytes"] > 0


async def _turn_or_end(conn: Any) -> dict[str, Any]:
    """A turn that may end in an error event or a closed socket: both are clean ends."""
    try:
        return await asyncio.wait_for(realtime_turn(conn, modality="text"), timeout=120)
    except ConnectionClosed as exc:
        return {"status": "closed", "code": exc.rcvd.code if exc.rcvd else None}


def _sessions(d: Deployed) -> dict[str, float]:
    return {worker: view.get("sessions", 0.0) for worker, view in d.workers().items()}


def _bound_worker(d: Deployed, before: dict[str, float]) -> str:
    (worker,) = [w for w, n in _sessions(d).items() if n > before.get(w, 0.0)]
    return worker


def test_deleting_a_worker_pod_ends_only_its_sessions(deployed: Deployed) -> None:
    deployed.wait_two_workers_in_rotation()
    url = deployed.router_url()

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        model = (await client.models.list()).data[0].id
        before_a = _sessions(deployed)
        async with client.realtime.connect(model=model) as a:
            assert (await realtime_turn(a, modality="text"))["status"] in ("completed", "incomplete")
            worker_a = _bound_worker(deployed, before_a)
            before_b = _sessions(deployed)
            async with client.realtime.connect(model=model) as b:
                assert (await realtime_turn(b, modality="text"))["status"] in ("completed", "incomplete")
                worker_b = _bound_worker(deployed, before_b)
                assert worker_a != worker_b, "the router spreads two sessions over two idle workers"
                deployed.tools.kubectl(
                    "delete", "pod", "-n", deployed.ns, f"{worker_a}-worker", "--wait=false"
                )
                # The pod terminates (SIGTERM, then SIGKILL after its grace period): session A
                # ends cleanly within that time, whatever turn it is in.
                deadline = time.monotonic() + GRACE + 60
                ended = await _turn_or_end(a)
                while ended["status"] in ("completed", "incomplete") and time.monotonic() < deadline:
                    await asyncio.sleep(1)
                    ended = await _turn_or_end(a)
                other = await asyncio.wait_for(realtime_turn(b, modality="audio"), timeout=300)
                return ended, other, {"a": worker_a, "b": worker_b}

    ended, other, bound = asyncio.run(scenario())
    assert ended["status"] in ("error", "closed"), ended  # a clean end, not a hang or a reply
    assert other["status"] in ("completed", "incomplete") and other["audio_bytes"] > 0, other
    # The operator replaces the pod; the new worker rejoins the router's table.
    deployed.wait_two_workers_in_rotation()
    assert set(deployed.workers()) >= {bound["a"], bound["b"]}


def test_rolling_image_upgrade_under_a_live_session(deployed: Deployed) -> None:
    """A new image tag: workers are replaced one by one, the live session keeps answering on its
    draining worker, new sessions land on new workers, and the drain ends when the session does."""
    new_image = f"{deployed.image}-rolled"
    deployed.node.ctr("images", "tag", "--force", deployed.image, new_image)
    url = deployed.router_url()
    turns: list[str] = []

    def new_workers() -> int:
        return sum(
            1
            for p in deployed.api.pods(deployed.name)
            if p["spec"]["containers"][0]["image"] == new_image
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        )

    async def scenario() -> float:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        model = (await client.models.list()).data[0].id
        async with client.realtime.connect(model=model) as live:
            turns.append((await realtime_turn(live, modality="text"))["status"])
            deployed.api.patch_spec(deployed.name, {"runtime": {"image": new_image}})
            deadline = time.monotonic() + READY_TIMEOUT
            while new_workers() < 1 and time.monotonic() < deadline:  # the rollout is under way
                turns.append((await realtime_turn(live, modality="text"))["status"])
                await asyncio.sleep(2)
            assert new_workers() >= 1, "no worker of the new image became Ready"
            async with client.realtime.connect(model=model) as fresh:
                turns.append((await realtime_turn(fresh, modality="text"))["status"])
            turns.append((await realtime_turn(live, modality="text"))["status"])
        return time.monotonic()

    closed_at = asyncio.run(scenario())
    assert turns and all(t in ("completed", "incomplete") for t in turns), turns

    def rolled() -> bool:
        pods_ = deployed.api.pods(deployed.name)
        return len(pods_) == 2 and new_workers() == 2

    wait_for("both workers on the new image", rolled, timeout=READY_TIMEOUT)
    deployed.wait_two_workers_in_rotation()
    # The drain ended with the session, not at drainTimeoutSeconds (600 s by default).
    assert time.monotonic() - closed_at < 600
    deployed.image = new_image


def test_deleting_the_deployment_collects_everything(deployed: Deployed) -> None:
    deployed.tools.kubectl("delete", "omnideployment", "-n", deployed.ns, deployed.name, "--wait=false")
    selector = f"{labels.DEPLOYMENT}={deployed.name}"
    kinds = {
        "pods": "/api/v1/namespaces/{ns}/pods",
        "services": "/api/v1/namespaces/{ns}/services",
        "configmaps": "/api/v1/namespaces/{ns}/configmaps",
        "deployments": "/apis/apps/v1/namespaces/{ns}/deployments",
    }

    def collected() -> bool:
        return all(not deployed.api.items(path, selector) for path in kinds.values())

    wait_for("every object of the deployment garbage-collected", collected, timeout=300)

    # The containers stopped on the node too, not only the API objects gone.
    def no_runtime_running() -> bool:
        runtime = {
            line.split()[0]
            for line in deployed.node.ctr("containers", "list").splitlines()[1:]
            if "omni-runtime" in line
        }
        running = {
            line.split()[0]
            for line in deployed.node.ctr("tasks", "list").splitlines()[1:]
            if "RUNNING" in line
        }
        return not runtime & running

    wait_for("no runtime container running on the node", no_runtime_running, timeout=120)
