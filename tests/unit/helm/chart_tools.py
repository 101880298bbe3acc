"""Running the real `helm` binary on the chart and validating what it prints.

Manifests of built-in kinds are checked with kubernetes_validate (strict: unknown fields fail)
against the oldest Kubernetes the chart supports and the newest schemas installed; custom resources
(OmniDeployment, the kopf peering kinds) are checked against the openAPIV3Schema of the CRDs the
chart itself ships, so a sample that the API server would refuse fails here first.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "helm" / "omni-operator"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
OLDEST_KUBERNETES = "1.27.0"  # Chart.yaml kubeVersion

sys.path.insert(0, str(REPO / "tests" / "tools"))
from install_k8s_tools import find_tool, missing_reason  # noqa: E402

Manifest = dict[str, Any]


class HelmError(RuntimeError):
    """helm exited non-zero; the message is its stderr."""


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    path = find_tool("helm")
    if path is None:
        raise FileNotFoundError(missing_reason("helm"))
    result = subprocess.run([str(path), *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise HelmError(result.stderr.strip())
    return result


def template(
    *, values: list[Path] = (), sets: dict[str, str] | None = None, namespace: str = "omni-system"
) -> list[Manifest]:
    """`helm template` the chart; the documents it prints, without the empty ones."""
    args = ["template", "omni", str(CHART), "--namespace", namespace]
    for path in values:
        args += ["--values", str(path)]
    for key, value in (sets or {}).items():
        args += ["--set", f"{key}={value}"]
    out = helm(*args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def chart_crds() -> dict[tuple[str, str], Manifest]:
    """The CRDs in the chart's crds/ folder keyed by (group, kind)."""
    crds: dict[tuple[str, str], Manifest] = {}
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                crds[(doc["spec"]["group"], doc["spec"]["names"]["kind"])] = doc
    return crds


def validate_custom_resource(manifest: Manifest) -> None:
    group, version = manifest["apiVersion"].split("/")
    crd = chart_crds()[(group, manifest["kind"])]
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    # OpenAPI v3.0 schemas use draft-04 keywords (boolean exclusiveMinimum); unknown
    # x-kubernetes-* keywords are ignored, the structural parts apply.
    jsonschema.Draft4Validator(served["schema"]["openAPIV3Schema"]).validate(manifest)


def validate(manifest: Manifest) -> None:
    """Raise when `manifest` is not a valid object of its kind."""
    group = manifest["apiVersion"].split("/")[0] if "/" in manifest["apiVersion"] else ""
    if group in {"omni.dev", "kopf.dev"}:
        validate_custom_resource(manifest)
        return
    for version in (OLDEST_KUBERNETES, kubernetes_validate.latest_version()):
        kubernetes_validate.validate(manifest, version, strict=True)


def by_kind(manifests: list[Manifest]) -> dict[str, list[Manifest]]:
    out: dict[str, list[Manifest]] = {}
    for manifest in manifests:
        out.setdefault(manifest["kind"], []).append(manifest)
    return out


def one(manifests: list[Manifest], kind: str) -> Manifest:
    (found,) = by_kind(manifests).get(kind, [])
    return found
