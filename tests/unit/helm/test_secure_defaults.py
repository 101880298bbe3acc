"""Secure defaults of what the operator creates, checked from the chart's side.

Every example goes through `omni render` (the CLI users run): its pods must meet the restricted
profile, stage pods must carry no service-account token, every worker must be fenced by its own
NetworkPolicy, and the chart's RBAC must let the operator create every object the renderer emits,
including the router's Role (Kubernetes refuses to let the operator grant what it does not hold).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_tools import REPO, one, template
from restricted_profile import pod_specs, restricted_violations

from omni_operator.api import labels
from omni_operator.k8s import CHILD_KINDS, PLURALS

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
# The one deliberate exception: a hostPath checkpoint is the user's choice, and hostPath volumes
# are outside the restricted (and baseline) profile. Everything else in that pod complies.
HOSTPATH_EXAMPLES = {"qwen2.5-omni-7b-h100.yaml"}
HOSTPATH_VIOLATION = "volume 'model' uses hostPath, not allowed"

Manifest = dict[str, Any]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Manifest]]:
    out: dict[str, list[Manifest]] = {}
    for path in EXAMPLES:
        result = subprocess.run(
            [sys.executable, "-m", "omni_operator.cli", "render", "-f", str(path), "-o", "json"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        out[path.name] = json.loads(result.stdout)["items"]
    return out


def test_examples_are_found() -> None:
    assert len(EXAMPLES) >= 5
    assert {p.name for p in EXAMPLES} >= HOSTPATH_EXAMPLES


@pytest.mark.parametrize("example", [p.name for p in EXAMPLES])
def test_rendered_pods_meet_the_restricted_profile(example: str, rendered: dict[str, list[Manifest]]) -> None:
    specs = [found for manifest in rendered[example] for found in pod_specs(manifest)]
    assert any(where.startswith("Pod/") for where, _ in specs)
    assert any(where.startswith("Deployment/") for where, _ in specs)  # the router
    for where, spec in specs:
        expected = [HOSTPATH_VIOLATION] if example in HOSTPATH_EXAMPLES and where.startswith("Pod/") else []
        assert restricted_violations(spec) == expected, where
        for container in spec["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, where
        assert spec["securityContext"]["runAsUser"] != 0


@pytest.mark.parametrize("example", [p.name for p in EXAMPLES])
def test_stage_pods_get_no_service_account_token(example: str, rendered: dict[str, list[Manifest]]) -> None:
    pods = [m for m in rendered[example] if m["kind"] == "Pod"]
    assert pods
    for pod in pods:
        assert pod["spec"]["automountServiceAccountToken"] is False, pod["metadata"]["name"]
        assert "serviceAccountName" not in pod["spec"]  # the namespace default, and without a token


@pytest.mark.parametrize("example", [p.name for p in EXAMPLES])
def test_every_worker_is_fenced_by_its_network_policy(
    example: str, rendered: dict[str, list[Manifest]]
) -> None:
    manifests = rendered[example]
    router = one(manifests, "Deployment")
    router_labels = router["spec"]["template"]["metadata"]["labels"]
    policies = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "NetworkPolicy"}
    workers = sorted({m["metadata"]["labels"][labels.WORKER] for m in manifests if m["kind"] == "Pod"})
    assert sorted(policies) == workers
    for pod in (m for m in manifests if m["kind"] == "Pod"):
        worker = pod["metadata"]["labels"][labels.WORKER]
        policy = policies[worker]["spec"]
        own = {labels.DEPLOYMENT: pod["metadata"]["labels"][labels.DEPLOYMENT], labels.WORKER: worker}
        assert policy["podSelector"] == {"matchLabels": own}
        assert own.items() <= pod["metadata"]["labels"].items()  # the policy selects this pod
        assert policy["policyTypes"] == ["Ingress", "Egress"]  # egress: render tests check its rules
        (rule,) = policy["ingress"]
        assert "ports" not in rule
        sources = [peer["podSelector"]["matchLabels"] for peer in rule["from"]]
        assert all(set(peer) == {"podSelector"} for peer in rule["from"])  # no namespace or IP peers
        assert sources[0] == own
        assert sources[1].items() <= router_labels.items()  # the router's pods match the second peer
        assert len(sources) == 2
        # No other worker's pods match either peer.
        for other in (m for m in manifests if m["kind"] == "Pod"):
            if other["metadata"]["labels"][labels.WORKER] != worker:
                assert not own.items() <= other["metadata"]["labels"].items()


def _allowed(rules: list[Manifest], group: str, resource: str, verb: str) -> bool:
    return any(
        group in r["apiGroups"]
        and resource in r["resources"]
        and verb in r["verbs"]
        and "resourceNames" not in r
        for r in rules
    )


@pytest.mark.usefixtures("helm_available")
def test_chart_rbac_covers_everything_the_renderer_emits(rendered: dict[str, list[Manifest]]) -> None:
    rules = one(template(), "Role")["rules"]
    kinds = {(m["apiVersion"], m["kind"]) for manifests in rendered.values() for m in manifests}
    assert kinds <= set(CHILD_KINDS), "render/ emits a kind k8s.py does not list"
    for api_version, kind in CHILD_KINDS:
        group = api_version.split("/")[0] if "/" in api_version else ""
        for verb in ("list", "create", "patch", "delete"):
            assert _allowed(rules, group, PLURALS[kind], verb), f"{verb} {kind}"


@pytest.mark.usefixtures("helm_available")
def test_operator_holds_every_permission_it_grants_the_router(rendered: dict[str, list[Manifest]]) -> None:
    operator_rules = one(template(), "Role")["rules"]
    for manifests in rendered.values():
        router_role = one(manifests, "Role")
        for rule in router_role["rules"]:
            assert "resourceNames" not in rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert _allowed(operator_rules, group, resource, verb), f"{verb} {group}/{resource}"


def test_router_credentials_are_mounted_not_copied(tmp_path: Path) -> None:
    """With spec.router.auth the keys stay in their Secret: mounted read-only into the router,
    never copied into any rendered object."""
    doc = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    doc["spec"]["router"]["auth"] = {"secretName": "router-keys"}
    path = tmp_path / "auth.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = subprocess.run(
        [sys.executable, "-m", "omni_operator.cli", "render", "-f", str(path), "-o", "json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    manifests = json.loads(result.stdout)["items"]
    assert not [m for m in manifests if m["kind"] == "Secret"]
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["auth"] == {"name": "auth", "secret": {"secretName": "router-keys"}}
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["auth"]["readOnly"] is True
    command = pod["containers"][0]["command"]
    assert command[command.index("--api-keys-file") + 1] == f"{mounts['auth']['mountPath']}/api-keys"
