"""The generated CRD: fresh, structural, and agreeing with the loader and the planner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from omni_operator import crdgen

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
CRD = crdgen.crd_manifest()
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_crds_dir_is_fresh() -> None:
    path = ROOT / "crds" / crdgen.CRD_FILE
    assert path.read_text(encoding="utf-8") == crdgen.crd_yaml(), "crds/ is stale: run `omni crd -o crds/`"


def test_crd_is_a_valid_kubernetes_object() -> None:
    kubernetes_validate.validate(CRD, kubernetes_validate.utils.latest_version(), strict=True)


def _walk(node: Any, path: str = "") -> list[tuple[str, dict]]:
    found: list[tuple[str, dict]] = []
    if isinstance(node, dict):
        found.append((path, node))
        for key, child in node.get("properties", {}).items():
            found += _walk(child, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            found += _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            found += _walk(node["additionalProperties"], f"{path}{{}}")
    return found


def test_schema_is_structural() -> None:
    forbidden = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "title", "const"}
    for path, node in _walk(SCHEMA):
        assert not forbidden & node.keys(), f"{path}: {forbidden & node.keys()}"
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{path} has no type"
        assert node.get("type") != "null", path
        if "properties" in node:
            assert node["type"] == "object", path
        if "default" in node:
            # Defaults must themselves be valid, or the API server rejects the CRD.
            jsonschema.Draft4Validator(_openapi_to_jsonschema(node)).validate(node["default"])


def test_schema_keeps_descriptions_enums_defaults_and_bounds() -> None:
    spec = SCHEMA["properties"]["spec"]
    thinker = spec["properties"]["stages"]["properties"]["thinker"]["properties"]
    assert thinker["tensorParallelSize"] == {
        "default": 1,
        "description": "GPUs the thinker is split across.",
        "maximum": 64,
        "minimum": 1,
        "type": "integer",
    }
    assert thinker["memFractionStatic"]["nullable"] is True
    assert (thinker["memFractionStatic"]["minimum"], thinker["memFractionStatic"]["exclusiveMinimum"]) == (
        0.0,
        True,
    )
    assert (thinker["memFractionStatic"]["maximum"], thinker["memFractionStatic"]["exclusiveMaximum"]) == (
        1.0,
        True,
    )
    assert spec["properties"]["pipeline"]["enum"] == ["text", "speech", "streaming-speech", "duplex"]
    assert spec["properties"]["pipeline"]["default"] == "speech"
    assert spec["properties"]["router"]["properties"]["auth"]["nullable"] is True
    assert spec["required"] == ["model"]
    assert spec["properties"]["model"]["description"] == "The model to serve."


def test_subresources_and_printer_columns() -> None:
    version = CRD["spec"]["versions"][0]
    assert CRD["metadata"]["name"] == "omnideployments.omni.dev"
    assert CRD["spec"]["names"]["shortNames"] == ["omnid"]
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.workers",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    assert [(c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"]] == [
        ("Workers", ".spec.workers"),
        ("Ready", ".status.workers.ready"),
        ("Phase", ".status.phase"),
        ("Endpoint", ".status.endpoint"),
        ("Age", ".metadata.creationTimestamp"),
    ]
    status = SCHEMA["properties"]["status"]["properties"]
    assert {
        "observedGeneration",
        "phase",
        "conditions",
        "workers",
        "replicas",
        "selector",
        "endpoint",
    } <= status.keys()


def _openapi_to_jsonschema(node: Any) -> Any:
    """OpenAPI v3.0 `nullable` -> JSON Schema type lists, for the jsonschema validator (Draft 4 bounds)."""
    if isinstance(node, list):
        return [_openapi_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _openapi_to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
    if out.pop("nullable", False):
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


VALIDATOR = jsonschema.Draft4Validator(_openapi_to_jsonschema(SCHEMA))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_validate_against_the_crd_schema(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        VALIDATOR.validate(doc)


def _tiny() -> dict:
    return yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())


BROKEN = [
    pytest.param(("spec", "workers"), "two", "'two' is not of type 'integer'", id="wrong-type"),
    pytest.param(("spec", "workers"), -1, "-1 is less than the minimum of 0", id="below-minimum"),
    pytest.param(("spec", "pipeline"), "speach", "'speach' is not one of", id="enum"),
    pytest.param(("spec", "stages"), {"thinker": {"memFractionStatic": 1.0}}, "greater than or equal to the maximum", id="exclusive-max"),
    pytest.param(("spec", "router"), {"sessionHeader": "bad header"}, "does not match", id="pattern"),
    pytest.param(("spec", "model"), {"path": "/m"}, "'name' is a required property", id="missing-required"),
    pytest.param(("spec", "model", "name"), "", "should be non-empty", id="empty-name"),
    pytest.param(("spec", "media"), {"allowedDomains": ["https://x.com"]}, "does not match", id="media-domain"),
    pytest.param(("spec", "media"), {"deniedNetworks": ["ten/8"]}, "does not match", id="media-network"),
    pytest.param(("spec", "speech"), {"maxStreams": -1}, "-1 is less than the minimum of 0", id="speech-limit"),
    pytest.param(("spec", "runtime"), {"env": {"OMNI_BUSY_STREAMS": 8}}, "8 is not of type 'string'", id="env-number"),
    pytest.param(("spec", "model", "path"), "models/x", "does not match", id="model-path-relative"),
    pytest.param(("spec", "model", "path"), "/m/../etc", "does not match", id="model-path-up"),
    pytest.param(("spec", "model", "path"), "/m/a\x00", "does not match", id="model-path-nul"),
    pytest.param(("spec", "model", "source"), {"type": "hostPath", "hostPath": "/mnt/.."}, "does not match", id="host-path-up"),
    pytest.param(("spec", "gpu", "nodeSelector"), {"pool": "a b"}, "does not match", id="selector-value"),
    pytest.param(("spec", "gpu", "tolerations"), [{"key": "k", "value": "a b"}], "does not match", id="toleration-value"),
    pytest.param(("spec", "gpu", "tolerations"), [{"key": "k", "effect": "Never"}], "does not match", id="toleration-effect"),
    pytest.param(("spec", "gpu", "tolerations"), [{"operator": "Exists"}] * 65, "is too long", id="tolerations-count"),
    pytest.param(("spec", "gpu", "nodeSelector"), {f"k{i}": "v" for i in range(65)}, "has too many properties", id="selector-count"),
]  # fmt: skip


@pytest.mark.parametrize(("where", "value", "message"), BROKEN)
def test_broken_instances_fail(where: tuple[str, ...], value: Any, message: str) -> None:
    doc = _tiny()
    node = doc
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    errors = [e.message for e in VALIDATOR.iter_errors(doc)]
    assert errors and any(message in e for e in errors), errors
