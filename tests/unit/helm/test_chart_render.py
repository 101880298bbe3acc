"""The chart as helm renders it: lint, every variant valid against Kubernetes schemas, and the
decisions the values drive (namespaced vs cluster RBAC, leader election, image, sample)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from chart_tools import CHART, CI_VALUES, by_kind, helm, one, template, validate

from omni_operator.api.spec import OmniDeployment

pytestmark = pytest.mark.usefixtures("helm_available")

CHART_LABELS = {"app.kubernetes.io/name": "omni-operator", "app.kubernetes.io/instance": "omni"}


def test_ci_variants_exist() -> None:
    assert [p.name for p in CI_VALUES] == [
        "all-namespaces-values.yaml",
        "default-values.yaml",
        "sample-on-values.yaml",
    ]


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda p: p.name if p else "no-values")
def test_helm_lint_strict(values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART)] + (["--values", str(values)] if values else [])
    result = helm(*args, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_every_rendered_manifest_is_valid(values: Path) -> None:
    manifests = template(values=[values])
    assert manifests
    for manifest in manifests:
        validate(manifest)


def test_default_objects_are_namespaced_and_complete() -> None:
    manifests = template()
    assert sorted((m["kind"], m["metadata"]["name"], m["metadata"].get("namespace")) for m in manifests) == [
        ("Deployment", "omni-omni-operator", "omni-system"),
        ("KopfPeering", "omni-operator", "omni-system"),
        ("PodDisruptionBudget", "omni-omni-operator", "omni-system"),
        ("Role", "omni-omni-operator", "omni-system"),
        ("RoleBinding", "omni-omni-operator", "omni-system"),
        ("ServiceAccount", "omni-omni-operator", "omni-system"),
    ]


def test_all_namespaces_uses_cluster_role_and_cluster_peering() -> None:
    manifests = template(values=[CHART / "ci" / "all-namespaces-values.yaml"])
    kinds = by_kind(manifests)
    assert "Role" not in kinds and "RoleBinding" not in kinds and "KopfPeering" not in kinds
    role, binding = one(manifests, "ClusterRole"), one(manifests, "ClusterRoleBinding")
    assert "namespace" not in role["metadata"] and "namespace" not in binding["metadata"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "omni-omni-operator",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "omni-omni-operator", "namespace": "omni-system"}
    ]
    assert one(manifests, "ClusterKopfPeering")["metadata"] == {
        "name": "omni-operator",
        "labels": one(manifests, "Deployment")["metadata"]["labels"],
    }
    args = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == ["operator", "--all-namespaces", "--liveness-port=8080", "--peering=omni-operator"]


def test_watch_namespace_moves_role_binding_and_peering_but_not_the_operator() -> None:
    manifests = template(sets={"watchNamespace": "models"})
    assert one(manifests, "Role")["metadata"]["namespace"] == "models"
    assert one(manifests, "RoleBinding")["metadata"]["namespace"] == "models"
    assert one(manifests, "RoleBinding")["subjects"][0]["namespace"] == "omni-system"
    assert one(manifests, "KopfPeering")["metadata"]["namespace"] == "models"
    deployment = one(manifests, "Deployment")
    assert deployment["metadata"]["namespace"] == "omni-system"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["args"][1] == "--namespace=models"


def test_operator_deployment_defaults() -> None:
    deployment = one(template(), "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["selector"] == {"matchLabels": CHART_LABELS}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "omni-omni-operator"
    assert pod["automountServiceAccountToken"] is True
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/omni-dev/omni-operator:0.1.0"
    assert container["args"] == [
        "operator",
        "--namespace=omni-system",
        "--liveness-port=8080",
        "--peering=omni-operator",
    ]
    assert container["ports"] == [{"name": "liveness", "containerPort": 8080, "protocol": "TCP"}]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"cpu": "1", "memory": "512Mi"},
    }
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert {"name": "HOME", "value": "/tmp"} in container["env"]
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["podAffinityTerm"]["labelSelector"] == {"matchLabels": CHART_LABELS}
    pdb = one(template(), "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": CHART_LABELS}}


def test_image_tag_and_digest_values() -> None:
    digest = "sha256:" + "ab" * 32
    manifests = template(
        sets={"image.repository": "registry.local/op", "image.tag": "1.2.3", "image.digest": digest}
    )
    image = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"registry.local/op:1.2.3@{digest}"


def test_single_replica_has_no_disruption_budget() -> None:
    assert "PodDisruptionBudget" not in by_kind(template(sets={"replicaCount": "1"}))


def test_standalone_single_replica_without_peering() -> None:
    manifests = template(sets={"replicaCount": "1", "leaderElection.enabled": "false"})
    kinds = by_kind(manifests)
    assert "KopfPeering" not in kinds
    assert all("kopf.dev" not in rule["apiGroups"] for rule in one(manifests, "Role")["rules"])
    args = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-1] == "--standalone"


def test_rbac_and_service_account_can_be_left_to_an_administrator() -> None:
    manifests = template(
        sets={"rbac.create": "false", "serviceAccount.create": "false", "serviceAccount.name": "ops"}
    )
    assert sorted(by_kind(manifests)) == ["Deployment", "KopfPeering", "PodDisruptionBudget"]
    assert one(manifests, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "ops"


def test_sample_is_off_by_default_and_a_valid_omnideployment_when_on() -> None:
    assert "OmniDeployment" not in by_kind(template())
    sample = one(template(values=[CHART / "ci" / "sample-on-values.yaml"]), "OmniDeployment")
    assert sample["metadata"]["name"] == "tiny-sample"
    assert sample["metadata"]["namespace"] == "omni-system"
    parsed = OmniDeployment.model_validate(sample)  # the operator's own model accepts it
    assert parsed.spec.model.source.type.value == "tiny"
    assert parsed.spec.gpu.tier.value == "cpu"


def test_notes_show_a_first_omnideployment_that_the_operator_accepts() -> None:
    out = helm("install", "omni", str(CHART), "--namespace", "models", "--dry-run=client").stdout
    notes = out.split("NOTES:", 1)[1]
    assert "kubectl -n models apply -f examples/tiny-cpu.yaml" in notes
    inline = notes.split("<<'YAML'\n", 1)[1].split("\nYAML\n", 1)[0]
    manifest = yaml.safe_load(inline)
    validate(manifest)
    assert OmniDeployment.model_validate(manifest).metadata.name == "tiny-omni"
    assert "kubectl apply --server-side --force-conflicts" in notes


# Blocks whose children are plain Kubernetes fields, documented by the block's own comment.
KUBERNETES_BLOCKS = {"livenessProbe", "readinessProbe", "resources", "podSecurityContext", "securityContext"}


def test_values_file_documents_every_key() -> None:
    """Every top-level key, and every key one level down outside Kubernetes-shaped blocks, has a
    comment on the line above it."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented, block = [], ""
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "-")) or ":" not in stripped:
            continue
        indent = len(line) - len(line.lstrip())
        key = stripped.split(":", 1)[0]
        if indent == 0:
            block = key
        needs_comment = indent == 0 or (indent == 2 and block not in KUBERNETES_BLOCKS)
        if needs_comment and not lines[i - 1].strip().startswith("#"):
            undocumented.append(f"{block}.{key}" if indent else key)
    assert undocumented == []


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (
            {},
            {
                "namespace": ["omni-system"],
                "all_namespaces": False,
                "peering": "omni-operator",
                "standalone": False,
            },
        ),
        (
            {"watchAllNamespaces": "true"},
            {"namespace": [], "all_namespaces": True, "peering": "omni-operator", "standalone": False},
        ),
        (
            {"replicaCount": "1", "leaderElection.enabled": "false", "watchNamespace": "models"},
            {
                "namespace": ["models"],
                "all_namespaces": False,
                "peering": "omni-operator",
                "standalone": True,
            },
        ),
        (
            {"leaderElection.peeringName": "team-a"},
            {"namespace": ["omni-system"], "all_namespaces": False, "peering": "team-a", "standalone": False},
        ),
    ],
)
def test_operator_cli_accepts_the_chart_arguments(sets: dict[str, str], expected: dict) -> None:
    """The container args parse with `omni operator`'s own parser, meaning what the chart intends."""
    from omni_operator.main import build_parser

    container = one(template(sets=sets), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == "operator"  # the image's ENTRYPOINT is `omni`
    parsed = vars(build_parser().parse_args(container["args"][1:]))
    assert {key: parsed[key] for key in expected} == expected
    assert parsed["liveness_port"] == container["ports"][0]["containerPort"] == 8080
