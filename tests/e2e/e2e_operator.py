"""Running `omni operator` against the test control plane, and reading what it did.

The operator runs as a real subprocess (the same `omni operator` a pod runs), so tests can kill it
mid-reconcile, restart it, or run two replicas side by side. Helpers read objects through the
admin client and wait with deadlines.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import httpx
from e2e_cluster import ControlPlane, die_with_parent, free_port, wait_for

from omni_operator.api import labels
from omni_operator.crdgen import crd_manifest
from omni_operator.k8s import PEERING_CRDS

DEPLOYMENTS = "/apis/omni.dev/v1alpha1/namespaces/{ns}/omnideployments"


def install_crds(cp: ControlPlane) -> None:
    """The generated OmniDeployment CRD (fresh from crdgen) and kopf's peering CRDs, Established."""
    crds = [crd_manifest(), *PEERING_CRDS]
    with cp.https() as client:
        for crd in crds:
            r = client.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
            assert r.status_code in (201, 409), r.text
        for crd in crds:
            path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"

            def established(path: str = path) -> bool:
                conds = client.get(path).json().get("status", {}).get("conditions", [])
                return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

            wait_for(f"CRD {crd['metadata']['name']} established", established, timeout=30)


class OperatorProcess:
    """One `omni operator --namespace NS` replica with its own log file."""

    def __init__(
        self, cp: ControlPlane, namespace: str, *, name: str = "operator", args: tuple[str, ...] = ()
    ) -> None:
        self.cp, self.namespace, self.name = cp, namespace, name
        self.port = free_port()
        self.log_path = cp.workdir / "logs" / f"{namespace}-{name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "omni_operator.cli",
            "operator",
            "--namespace",
            namespace,
            "--kubeconfig",
            str(cp.kubeconfig),
            "--liveness-port",
            str(self.port),
            *args,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=die_with_parent(os.getpid()),  # a killed pytest takes it along
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_live(self, timeout: float = 60) -> OperatorProcess:
        def live() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            return httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=2).status_code == 200

        wait_for(f"operator {self.name} liveness", live, timeout=timeout)
        return self

    def kill(self) -> None:
        """SIGKILL: no cleanup, as a crashed or OOM-killed pod."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def reconcile_lines(self, deployment: str) -> list[str]:
        return [
            line for line in self.log().splitlines() if f"reconcile {self.namespace}/{deployment}:" in line
        ]


@contextlib.contextmanager
def running_operator(cp: ControlPlane, namespace: str, **kwargs: Any) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cp, namespace, **kwargs)
    try:
        yield op.wait_live()
    finally:
        op.stop()


def deployment(
    name: str, *, workers: int = 2, tp: int = 1, spec: dict[str, Any] | None = None
) -> dict[str, Any]:
    """An OmniDeployment of the builtin runtime on H100s: api pod + thinker (tp GPUs) + talker (1 GPU)."""
    body: dict[str, Any] = {
        "model": {"name": "Qwen2.5-Omni-7B", "path": "/models/qwen"},
        "pipeline": "speech",
        "workers": workers,
        "stages": {"thinker": {"tensorParallelSize": tp}},
        "gpu": {"tier": "h100"},
    }
    body.update(spec or {})
    return {
        "apiVersion": "omni.dev/v1alpha1",
        "kind": "OmniDeployment",
        "metadata": {"name": name},
        "spec": body,
    }


class Api:
    """Small reads and writes through the admin client, scoped to one namespace."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.cp, self.ns = cp, namespace
        self.client = cp.https()

    def close(self) -> None:
        self.client.close()

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        r = self.client.post(DEPLOYMENTS.format(ns=self.ns), json=body)
        assert r.status_code == 201, r.text
        return r.json()

    def get(self, name: str) -> dict[str, Any] | None:
        r = self.client.get(f"{DEPLOYMENTS.format(ns=self.ns)}/{name}")
        return r.json() if r.status_code == 200 else None

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        r = self.client.patch(
            f"{DEPLOYMENTS.format(ns=self.ns)}/{name}",
            json={"spec": spec},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert r.status_code == 200, r.text

    def items(self, path: str, selector: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": selector} if selector else None
        r = self.client.get(path.format(ns=self.ns), params=params)
        assert r.status_code == 200, r.text
        return r.json()["items"]

    def pods(self, deployment: str) -> list[dict[str, Any]]:
        return self.items(
            "/api/v1/namespaces/{ns}/pods", f"{labels.DEPLOYMENT}={deployment},{labels.COMPONENT}=worker"
        )

    def services(self, deployment: str) -> list[dict[str, Any]]:
        return self.items("/api/v1/namespaces/{ns}/services", f"{labels.DEPLOYMENT}={deployment}")

    def events(self) -> list[dict[str, Any]]:
        return self.items("/api/v1/namespaces/{ns}/events")

    def wait_status(
        self, name: str, what: str, check: Callable[[dict[str, Any]], bool], timeout: float = 60
    ) -> dict:
        def ok() -> bool:
            body = self.get(name)
            return body is not None and check(body.get("status") or {})

        wait_for(f"{name}: {what}", ok, timeout=timeout)
        body = self.get(name)
        assert body is not None
        return body["status"]

    def wait_ready(self, name: str, workers: int, timeout: float = 90) -> dict:
        def ready(st: dict[str, Any]) -> bool:
            return st.get("phase") == "Ready" and st.get("workers", {}).get("ready") == workers

        return self.wait_status(name, f"Ready with {workers} workers", ready, timeout=timeout)


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == kind)


def uids(objs: list[dict[str, Any]]) -> dict[str, str]:
    return {o["metadata"]["name"]: o["metadata"]["uid"] for o in objs}


def gpu_request(pod: dict[str, Any]) -> int:
    return sum(
        int(c.get("resources", {}).get("requests", {}).get("nvidia.com/gpu", 0))
        for c in pod["spec"]["containers"]
    )
