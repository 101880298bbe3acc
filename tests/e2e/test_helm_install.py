"""The Helm chart on the real control plane: `helm install`, then the operator as its ServiceAccount.

kwok pods never run containers, so the operator image is not pulled here. What is proven instead:
the API server accepts every object of the chart (CRDs, RBAC, peering, Deployment) into a namespace
whose PodSecurity admission enforces "restricted"; the operator's ServiceAccount may do exactly
what the operator needs (`kubectl auth can-i --as`) and nothing it must not; and `omni operator`,
started with that ServiceAccount's token, reconciles an OmniDeployment to Ready, its stage pods
admitted by the same restricted admission. The rendered pods of every example go through that
admission too (server-side dry run).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_cluster import ControlPlane, wait_for
from e2e_operator import Api, OperatorProcess

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "omni-operator"
sys.path.insert(0, str(REPO / "tests" / "tools"))
from install_k8s_tools import find_tool, missing_reason  # noqa: E402

RELEASE = "omni"
SA = "omni-omni-operator"  # the chart's fullname for release "omni"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


class Tools:
    """helm and kubectl from tests/tools, pointed at the control plane's admin kubeconfig."""

    def __init__(self, cp: ControlPlane, home: Path) -> None:
        self.cp = cp
        paths = {name: find_tool(name) for name in ("helm", "kubectl")}
        missing = [name for name, path in paths.items() if path is None]
        if missing:
            pytest.skip(missing_reason(missing[0]))
        self.helm_bin, self.kubectl_bin = str(paths["helm"]), str(paths["kubectl"])
        # Helm keeps its cache and config under these; a test never touches the user's.
        self.env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def run(
        self, binary: str, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [binary, "--kubeconfig", str(self.cp.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=240,
            env=self.env,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{Path(binary).name} {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
            )
        return result

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.run(self.helm_bin, *args, check=check)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        return self.run(self.kubectl_bin, *args, input=input, check=check)

    def can_i(self, namespace: str, verb: str, resource: str, *, as_sa: str = SA, sa_namespace: str) -> bool:
        """`kubectl auth can-i` as the ServiceAccount. `resource` may be `kind/name` or
        `kind#subresource` (e.g. `omnideployments.omni.dev#status`)."""
        resource, _, subresource = resource.partition("#")
        extra = [f"--subresource={subresource}"] if subresource else []
        result = self.kubectl(
            "auth", "can-i", verb, resource, *extra, "-n", namespace,
            f"--as=system:serviceaccount:{sa_namespace}:{as_sa}", check=False,
        )  # fmt: skip
        assert result.stdout.strip() in {"yes", "no"}, result.stderr
        return result.stdout.strip() == "yes"


def create_namespace(cp: ControlPlane, labels: dict[str, str] | None = None) -> str:
    name = f"helm-{uuid.uuid4().hex[:8]}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
    with cp.https() as client:
        r = client.post("/api/v1/namespaces", json=body)
        assert r.status_code == 201, r.text
        wait_for(
            f"service account default in {name}",
            lambda: client.get(f"/api/v1/namespaces/{name}/serviceaccounts/default").status_code == 200,
            timeout=30,
        )
    return name


def delete_namespace(cp: ControlPlane, name: str) -> None:
    with cp.https() as client:
        client.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture(scope="module")
def tools(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Tools:
    return Tools(control_plane, tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane, tools: Tools) -> Iterator[str]:
    """The chart with its default values in a namespace that enforces the restricted profile."""
    namespace = create_namespace(control_plane, RESTRICTED)
    try:
        tools.helm("install", RELEASE, str(CHART), "--namespace", namespace, "--wait", "--timeout", "180s")
        yield namespace
    finally:
        tools.helm("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout", "60s", check=False)
        delete_namespace(control_plane, namespace)


def get(cp: ControlPlane, path: str) -> dict[str, Any]:
    with cp.https() as client:
        r = client.get(path)
        assert r.status_code == 200, f"GET {path}: {r.status_code} {r.text}"
        return r.json()


def test_chart_objects_are_accepted_and_the_operator_deployment_is_available(
    control_plane: ControlPlane, installed: str
) -> None:
    ns = installed
    for name in ("omnideployments.omni.dev", "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"):
        crd = get(control_plane, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        assert any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"])
    deployment = get(control_plane, f"/apis/apps/v1/namespaces/{ns}/deployments/{SA}")
    # kwok runs the pods (no containers): both replicas were admitted under "restricted" and are Ready.
    assert deployment["status"].get("availableReplicas") == 2
    pods = get(
        control_plane, f"/api/v1/namespaces/{ns}/pods?labelSelector=app.kubernetes.io/name=omni-operator"
    )
    assert len(pods["items"]) == 2
    assert all(p["spec"]["serviceAccountName"] == SA for p in pods["items"])
    get(control_plane, f"/apis/kopf.dev/v1/namespaces/{ns}/kopfpeerings/omni-operator")
    get(control_plane, f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles/{SA}")
    get(control_plane, f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{SA}")


# (verb, resource): every request omni_operator and kopf make in the watched namespace.
NEEDED = [
    ("list", "omnideployments.omni.dev"),
    ("watch", "omnideployments.omni.dev"),
    ("patch", "omnideployments.omni.dev"),
    ("patch", "omnideployments.omni.dev#status"),
    *((verb, "pods") for verb in ("get", "list", "watch", "create", "patch", "delete")),
    *((verb, "services") for verb in ("get", "list", "watch", "create", "patch", "delete")),
    *(
        (verb, resource)
        for resource in (
            "configmaps",
            "serviceaccounts",
            "deployments.apps",
            "poddisruptionbudgets.policy",
            "networkpolicies.networking.k8s.io",
            "roles.rbac.authorization.k8s.io",
            "rolebindings.rbac.authorization.k8s.io",
        )
        for verb in ("list", "create", "patch", "delete")
    ),
    ("get", "endpointslices.discovery.k8s.io"),
    ("create", "events"),
    ("list", "kopfpeerings.kopf.dev"),
    ("watch", "kopfpeerings.kopf.dev"),
    ("get", "kopfpeerings.kopf.dev/omni-operator"),
    ("patch", "kopfpeerings.kopf.dev/omni-operator"),
]
# What a least-privilege operator must not be able to do.
FORBIDDEN = [
    ("get", "secrets"),
    ("list", "secrets"),
    ("delete", "omnideployments.omni.dev"),
    ("create", "omnideployments.omni.dev"),
    ("update", "pods"),
    ("create", "pods#exec"),
    ("get", "omnideployments.omni.dev#status"),
    ("escalate", "roles.rbac.authorization.k8s.io"),
    ("bind", "roles.rbac.authorization.k8s.io"),
    ("patch", "kopfpeerings.kopf.dev/someone-else"),
    ("delete", "persistentvolumeclaims"),
]


def test_operator_service_account_has_exactly_the_needed_rights(tools: Tools, installed: str) -> None:
    ns = installed
    denied = [f"{verb} {res}" for verb, res in NEEDED if not tools.can_i(ns, verb, res, sa_namespace=ns)]
    assert denied == []
    allowed = [f"{verb} {res}" for verb, res in FORBIDDEN if tools.can_i(ns, verb, res, sa_namespace=ns)]
    assert allowed == []
    # Namespaced by default: nothing in another namespace, nothing cluster-scoped.
    assert not tools.can_i("default", "list", "pods", sa_namespace=ns)
    assert not tools.can_i("default", "list", "omnideployments.omni.dev", sa_namespace=ns)
    assert not tools.can_i("", "list", "nodes", sa_namespace=ns)
    assert not tools.can_i("", "list", "namespaces", sa_namespace=ns)


def service_account_kubeconfig(cp: ControlPlane, tools: Tools, namespace: str, path: Path) -> Path:
    """A kubeconfig carrying a token of the chart's ServiceAccount (TokenRequest API)."""
    token = tools.kubectl("create", "token", SA, "-n", namespace, "--duration", "1h").stdout.strip()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "e2e",
                "cluster": {"server": cp.server, "certificate-authority": str(cp.certs["ca.crt"])},
            }
        ],
        "users": [{"name": SA, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "e2e", "user": SA, "namespace": namespace}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_operator_with_the_chart_service_account_reconciles_a_deployment(
    control_plane: ControlPlane, tools: Tools, installed: str, tmp_path: Path
) -> None:
    ns = installed
    kubeconfig = service_account_kubeconfig(control_plane, tools, ns, tmp_path / "sa.kubeconfig")
    # The chart's peering name and the namespace the chart's Role covers; the token replaces the
    # admin kubeconfig (the last --kubeconfig wins).
    operator = OperatorProcess(
        control_plane,
        ns,
        name="chart-sa",
        args=("--kubeconfig", str(kubeconfig), "--peering", "omni-operator"),
    )
    api = Api(control_plane, ns)
    try:
        operator.wait_live()
        tools.kubectl("apply", "-n", ns, "-f", str(REPO / "examples" / "tiny-cpu.yaml"))
        status = api.wait_ready("tiny-omni", 2, timeout=180)
        assert status["phase"] == "Ready"
        pods = api.pods("tiny-omni")
        assert len(pods) == 2 and all(p["status"]["phase"] == "Running" for p in pods)
        # The router's Role was created by the operator: it held every right it granted.
        get(control_plane, f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles/tiny-omni-router")
        # No request of the operator was refused, except kopf's optional cluster scanning
        # (namespaces, CRDs), which it skips with a warning when not allowed: the chart grants no
        # cluster-scoped reads for a namespaced operator on purpose.
        refused = [
            line
            for line in operator.log().splitlines()
            if "forbidden" in line.lower() or HTTP_403.search(line)
        ]
        unexpected = [line for line in refused if not KOPF_SCANNING.search(line)]
        assert unexpected == []
    finally:
        operator.stop()
        api.close()
        tools.kubectl(
            "delete", "-n", ns, "-f", str(REPO / "examples" / "tiny-cpu.yaml"), "--wait=false", check=False
        )


# A 403 status, not a duration that happens to read 403 ("reconcile ... in 403 ms") nor a log
# line's milliseconds ("[2026-11-27 04:37:47,403]", which failed this test once).
HTTP_403 = re.compile(r"(?<![\d.,:])403(?![\d.]|\s*ms)")
KOPF_SCANNING = re.compile(r'cannot (list|watch) resource "(namespaces|customresourcedefinitions)"')


def render(example: Path, namespace: str) -> str:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "omni_operator.cli",
            "render",
            "-f",
            str(example),
            "-n",
            namespace,
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("example", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_rendered_examples_pass_restricted_admission(tools: Tools, installed: str, example: Path) -> None:
    result = tools.kubectl(
        "apply", "--dry-run=server", "-n", installed, "-f", "-", input=render(example, installed), check=False
    )
    if example.name == "qwen2.5-omni-7b-h100.yaml":
        # The only exception: a hostPath checkpoint, outside the restricted (and baseline) profile.
        assert result.returncode != 0
        assert 'violates PodSecurity "restricted:latest": restricted volume types' in result.stderr
        assert "hostPath" in result.stderr
    else:
        assert result.returncode == 0, result.stderr


@pytest.fixture
def scratch_namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = create_namespace(control_plane, RESTRICTED)
    yield name
    delete_namespace(control_plane, name)


def test_all_namespaces_variant_grants_cluster_wide_rights(
    control_plane: ControlPlane, tools: Tools, scratch_namespace: str
) -> None:
    ns = scratch_namespace
    release = "omni-all"
    sa_name = "omni-all-omni-operator"  # the chart's fullname: release name + chart name
    values = CHART / "ci" / "all-namespaces-values.yaml"
    try:
        tools.helm(
            "install", release, str(CHART), "-n", ns, "--values", str(values), "--wait", "--timeout", "180s"
        )
        accounts = json.loads(tools.kubectl("get", "serviceaccounts", "-n", ns, "-o", "json").stdout)["items"]
        assert sorted(a["metadata"]["name"] for a in accounts) == ["default", sa_name]
        assert tools.can_i("default", "create", "pods", as_sa=sa_name, sa_namespace=ns)
        assert tools.can_i("kube-system", "watch", "omnideployments.omni.dev", as_sa=sa_name, sa_namespace=ns)
        assert tools.can_i(
            "", "patch", "clusterkopfpeerings.kopf.dev/omni-operator", as_sa=sa_name, sa_namespace=ns
        )
        assert not tools.can_i("default", "get", "secrets", as_sa=sa_name, sa_namespace=ns)
        get(control_plane, "/apis/kopf.dev/v1/clusterkopfpeerings/omni-operator")
    finally:
        tools.helm("uninstall", release, "-n", ns, "--wait", "--timeout", "60s", check=False)
    with control_plane.https() as client:
        assert client.get("/apis/kopf.dev/v1/clusterkopfpeerings/omni-operator").status_code == 404
        assert client.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{sa_name}").status_code == 404


def test_sample_variant_creates_an_omnideployment_the_api_server_accepts(
    control_plane: ControlPlane, tools: Tools, scratch_namespace: str
) -> None:
    ns = scratch_namespace
    values = CHART / "ci" / "sample-on-values.yaml"
    try:
        tools.helm(
            "install", "sample", str(CHART), "-n", ns, "--values", str(values), "--wait", "--timeout", "180s"
        )
        body = get(control_plane, f"/apis/omni.dev/v1alpha1/namespaces/{ns}/omnideployments/tiny-sample")
        assert body["spec"]["model"]["source"] == {"type": "tiny"}
        assert body["spec"]["model"]["path"] == "/models/model"  # CRD default applied by the server
    finally:
        tools.helm("uninstall", "sample", "-n", ns, "--wait", "--timeout", "60s", check=False)
