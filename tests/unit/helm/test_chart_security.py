"""The chart's secure defaults: restricted pods and least-privilege RBAC, exact rule by rule."""

from __future__ import annotations

import pytest
from chart_tools import CHART, CI_VALUES, one, template
from restricted_profile import pod_specs, restricted_violations

pytestmark = pytest.mark.usefixtures("helm_available")

WRITE = ["list", "create", "patch", "delete"]
OPERATOR_RULES = [
    {"apiGroups": ["omni.dev"], "resources": ["omnideployments"], "verbs": ["list", "watch", "patch"]},
    {"apiGroups": ["omni.dev"], "resources": ["omnideployments/status"], "verbs": ["patch"]},
    {
        "apiGroups": [""],
        "resources": ["pods", "services"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    },
    {"apiGroups": [""], "resources": ["configmaps", "serviceaccounts"], "verbs": WRITE},
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": WRITE},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": WRITE},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": WRITE},
    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": WRITE},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]


def peering_rules(resource: str) -> list[dict]:
    return [
        {"apiGroups": ["kopf.dev"], "resources": [resource], "verbs": ["list", "watch"]},
        {
            "apiGroups": ["kopf.dev"],
            "resources": [resource],
            "resourceNames": ["omni-operator"],
            "verbs": ["get", "patch"],
        },
    ]


def test_namespaced_role_rules_exactly() -> None:
    assert one(template(), "Role")["rules"] == OPERATOR_RULES + peering_rules("kopfpeerings")


def test_cluster_role_rules_exactly() -> None:
    role = one(template(values=[CHART / "ci" / "all-namespaces-values.yaml"]), "ClusterRole")
    assert role["rules"] == OPERATOR_RULES + peering_rules("clusterkopfpeerings")


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_no_wildcards_secrets_or_escalation(values) -> None:
    manifests = template(values=[values])
    rules = [r for m in manifests if m["kind"] in {"Role", "ClusterRole"} for r in m["rules"]]
    assert rules
    for rule in rules:
        assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"], rule
        assert "secrets" not in rule["resources"], (
            "the operator never reads Secrets (router keys stay out of it)"
        )
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule
        assert not {"nodes", "namespaces", "customresourcedefinitions", "clusterroles"} & set(
            rule["resources"]
        )


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_operator_pod_meets_the_restricted_profile(values) -> None:
    ((where, spec),) = [found for m in template(values=[values]) for found in pod_specs(m)]
    assert where == "Deployment/omni-omni-operator"
    assert restricted_violations(spec) == []
    container = spec["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["runAsUser"] == 10001  # the image's USER


def test_service_account_does_not_automount_its_token() -> None:
    assert one(template(), "ServiceAccount")["automountServiceAccountToken"] is False


def test_checker_flags_a_weakened_operator_pod() -> None:
    """The restricted check is not vacuous: loosening the chart's values is caught."""
    manifests = template(
        sets={
            "securityContext.allowPrivilegeEscalation": "true",
            "securityContext.capabilities.drop": "null",
            "podSecurityContext.runAsNonRoot": "false",
            "securityContext.runAsNonRoot": "null",
            "podSecurityContext.seccompProfile.type": "Unconfined",
            "securityContext.seccompProfile": "null",
        }
    )
    ((_, spec),) = [found for m in manifests for found in pod_specs(m)]
    assert restricted_violations(spec) == [
        "securityContext.seccompProfile.type Unconfined is not allowed",
        "containers[0] (operator): securityContext.allowPrivilegeEscalation must be false",
        "containers[0] (operator): securityContext.capabilities.drop must include ALL",
        "containers[0] (operator): runAsNonRoot must be true (container or pod securityContext)",
        "containers[0] (operator): seccompProfile.type must be RuntimeDefault or Localhost (container or pod)",
    ]
