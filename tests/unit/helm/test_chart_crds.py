"""The chart's CRDs: the OmniDeployment CRD is the generated one, byte for byte, and the kopf
peering CRDs are structural and match the kinds the chart's templates create.

Upgrade story (helm/omni-operator/README.md): the CRDs live in the chart's crds/ folder, which Helm
installs on `helm install` and never upgrades or deletes; an upgrade applies them first with
`kubectl apply --server-side`. The copy in the chart is refreshed by `omni crd -o helm/omni-operator/crds`.
"""

from __future__ import annotations

import subprocess
import sys

import kubernetes_validate
import yaml
from chart_tools import CHART, REPO, chart_crds

GENERATED = REPO / "crds" / "omni.dev_omnideployments.yaml"
IN_CHART = CHART / "crds" / "omni.dev_omnideployments.yaml"


def test_chart_crd_is_the_generated_crd() -> None:
    assert IN_CHART.read_bytes() == GENERATED.read_bytes(), (
        f"{IN_CHART.relative_to(REPO)} differs from {GENERATED.relative_to(REPO)}; "
        "run `omni crd -o crds/ && omni crd -o helm/omni-operator/crds/`"
    )


def test_chart_crd_is_what_omni_crd_prints_now() -> None:
    """Not only equal to the committed file: equal to what the API models generate today."""
    printed = subprocess.run(
        [sys.executable, "-m", "omni_operator.cli", "crd"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout
    assert yaml.safe_load(printed) == yaml.safe_load(IN_CHART.read_text())


def test_chart_ships_exactly_the_crds_it_uses() -> None:
    assert sorted(chart_crds()) == [
        ("kopf.dev", "ClusterKopfPeering"),
        ("kopf.dev", "KopfPeering"),
        ("omni.dev", "OmniDeployment"),
    ]
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == [
        "kopf.dev_peerings.yaml",
        "omni.dev_omnideployments.yaml",
    ]


def test_every_crd_is_a_valid_structural_v1_crd() -> None:
    for (group, kind), crd in chart_crds().items():
        kubernetes_validate.validate(crd, kubernetes_validate.latest_version(), strict=True)
        assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
        assert crd["metadata"]["name"] == f"{crd['spec']['names']['plural']}.{group}", kind
        for version in crd["spec"]["versions"]:
            assert version["schema"]["openAPIV3Schema"]["type"] == "object"


def test_peering_crd_scopes() -> None:
    crds = chart_crds()
    assert crds[("kopf.dev", "KopfPeering")]["spec"]["scope"] == "Namespaced"
    assert crds[("kopf.dev", "ClusterKopfPeering")]["spec"]["scope"] == "Cluster"
    for kind in ("KopfPeering", "ClusterKopfPeering"):
        status = crds[("kopf.dev", kind)]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
            "status"
        ]
        # kopf writes free-form keep-alives into status: pruning them would break leader election.
        assert status["x-kubernetes-preserve-unknown-fields"] is True
