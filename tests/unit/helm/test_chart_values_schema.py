"""values.schema.json: bad values stop `helm template` with a message naming the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from chart_tools import CHART, CI_VALUES, HelmError, template

pytestmark = pytest.mark.usefixtures("helm_available")

SCHEMA = json.loads((CHART / "values.schema.json").read_text())

# (dotted key -> value, text the error must contain): each names the key and what is wrong with it.
BAD_VALUES: list[tuple[dict[str, Any], str]] = [
    ({"replicaCount": "two"}, "at '/replicaCount': got string, want integer"),
    ({"replicaCount": -1}, "at '/replicaCount': minimum: got -1, want 0"),
    ({"bogus": 1}, "additional properties 'bogus' not allowed"),
    (
        {"image.pullPolicy": "Sometimes"},
        "at '/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'",
    ),
    ({"image.digest": "abc"}, "at '/image/digest': 'abc' does not match pattern"),
    ({"image.registry": "x"}, "at '/image': additional properties 'registry' not allowed"),
    ({"livenessPort": 80}, "at '/livenessPort': minimum: got 80, want 1,024"),
    ({"watchAllNamespaces": "yes"}, "at '/watchAllNamespaces': got string, want boolean"),
    ({"watchNamespace": "Team_A"}, "at '/watchNamespace': 'Team_A' does not match pattern"),
    ({"leaderElection.peeringName": "Not Valid"}, "at '/leaderElection/peeringName'"),
    ({"resources.requests.cpu": "lots"}, "at '/resources/requests/cpu'"),
    ({"sample.name": "Bad_Name"}, "at '/sample/name': 'Bad_Name' does not match pattern"),
    ({"rbac.create": "maybe"}, "at '/rbac/create': got string, want boolean"),
    # A template-level rule with its own message (two reconcilers would fight over every object).
    (
        {"leaderElection.enabled": False},
        "replicaCount: 2 with leaderElection.enabled: false would run 2 operators reconciling the same "
        "objects; set replicaCount: 1 or leaderElection.enabled: true",
    ),
    (
        {"serviceAccount.create": False},
        "serviceAccount.name is required when serviceAccount.create is false",
    ),
]


@pytest.mark.parametrize(("values", "message"), BAD_VALUES, ids=lambda v: str(v)[:40])
def test_bad_values_fail_with_a_clear_message(values: dict[str, Any], message: str, tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(_nest(values)))
    with pytest.raises(HelmError) as failure:
        template(values=[path])
    assert message in str(failure.value)


def _nest(dotted: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        *parents, leaf = key.split(".")
        node = out
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return out


def test_schema_is_draft_07_and_closed_at_the_top() -> None:
    assert SCHEMA["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert SCHEMA["additionalProperties"] is False
    jsonschema.Draft7Validator.check_schema(SCHEMA)


def test_defaults_and_ci_variants_satisfy_the_schema() -> None:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.Draft7Validator(SCHEMA).validate(defaults)
    for path in CI_VALUES:
        merged = _merge(defaults, yaml.safe_load(path.read_text()) or {})
        jsonschema.Draft7Validator(SCHEMA).validate(merged)


def test_every_default_key_is_in_the_schema() -> None:
    """additionalProperties false must never reject a key values.yaml itself sets."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert sorted(set(defaults) - set(SCHEMA["properties"])) == []
    assert sorted(set(SCHEMA["properties"]) - set(defaults) - {"global"}) == []


def _merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out
