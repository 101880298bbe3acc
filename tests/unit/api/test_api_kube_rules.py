"""Kubernetes' own rules for the spec values that reach a pod unchanged (api/kube_rules.py): label
keys and values in spec.gpu.nodeSelector and tolerations, a toleration's operator, effect and their
combinations, absolute paths in spec.model.path and spec.model.source.hostPath. Each refusal is one
loader message naming the field; what Kubernetes takes still loads."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from omni_operator.api.kube_rules import (
    ABSOLUTE_PATH_PATTERN,
    EFFECT_FIX,
    LABEL_KEY_FIX,
    LABEL_VALUE_FIX,
    LABEL_VALUE_PATTERN,
    OPERATOR_FIX,
    RESOURCE_NAME_FIX,
    RESOURCE_NAME_REASON,
    is_label_key,
)
from omni_operator.api.load import SpecError, parse_deployments
from omni_operator.api.spec import NUL_FIX, NUL_REASON

PREFIX_253 = ".".join(["a" * 63] * 4)[:253]  # a DNS subdomain of 253 characters
NAME_63 = "n" + "-" * 61 + "n"
PATH = ABSOLUTE_PATH_PATTERN
MODEL_PATH_FIX = "use an absolute path without '..' elements, such as '/models/model'"
HOST_PATH_FIX = "use the node directory's absolute path, without '..' elements, such as '/mnt/models'"
NO_KEY = "a toleration without a key matches every taint only with operator Exists; set key, or set operator: Exists"


def load(spec: dict[str, Any]) -> None:
    doc = {"apiVersion": "omni.dev/v1alpha1", "kind": "OmniDeployment", "metadata": {"name": "d"}}
    parse_deployments(yaml.safe_dump({**doc, "spec": {"model": {"name": "m"}, **spec}}), file="d.yaml")


def gpu(**fields: Any) -> dict[str, Any]:
    return {"gpu": fields}


def model(**fields: Any) -> dict[str, Any]:
    return {"model": {"name": "m", **fields}}


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("a", True),
        ("gpu", True),
        ("nvidia.com/gpu.product", True),
        ("kubernetes.io/hostname", True),
        ("A_b-c.D", True),
        (NAME_63, True),
        (f"{PREFIX_253}/{NAME_63}", True),
        ("", False),
        ("-a", False),
        ("a_", False),
        (NAME_63 + "n", False),
        ("a b", False),
        ("/a", False),
        ("a/", False),
        ("a/b/c", False),
        ("Example.com/a", False),  # the prefix is lower case
        ("example..com/a", False),
        ("-example.com/a", False),
        (f"{PREFIX_253}a/b", False),  # a prefix of 254 characters
        ("é", False),
    ],
)
def test_label_keys(key: str, ok: bool) -> None:
    assert is_label_key(key) is ok


@pytest.mark.parametrize(
    ("value", "ok"),
    [("", True), ("a", True), ("NVIDIA-H100-80GB_HBM3.x", True), (NAME_63, True), (NAME_63 + "n", False),
     ("-a", False), ("a.", False), ("NVIDIA H100", False), ("a/b", False)],
)  # fmt: skip
def test_label_values(value: str, ok: bool) -> None:
    assert bool(re.fullmatch(LABEL_VALUE_PATTERN, value)) is ok


@pytest.mark.parametrize(
    ("path", "ok"),
    [("/", True), ("/models", True), ("/models/qwen/", True), ("/a/./b", True), ("/..x/...", True),
     ("/a/.b", True), ("models", False), ("./models", False), ("", False), ("/a/..", False),
     ("/../etc", False), ("/a/../b", False), ("//a", False), ("/a//b", False), ("/a\x00b", False)],
)  # fmt: skip
def test_absolute_paths(path: str, ok: bool) -> None:
    assert bool(re.fullmatch(PATH, path)) is ok


def _key_error(key: str) -> str:
    return f"d.yaml: spec.gpu.nodeSelector.{key}: is not a label key; {LABEL_KEY_FIX}"


def _value_error(field: str, value: str) -> str:
    return f"d.yaml: {field}: {value!r} does not match {LABEL_VALUE_PATTERN}; {LABEL_VALUE_FIX}"


REFUSED = [
    pytest.param(gpu(nodeSelector={"gpu type": "h100"}), _key_error("gpu type"), id="selector-key-space"),
    pytest.param(gpu(nodeSelector={"": "h100"}), _key_error("''"), id="selector-key-empty"),
    pytest.param(gpu(nodeSelector={"Example.com/gpu": "h100"}), _key_error("Example.com/gpu"), id="selector-key-prefix-case"),
    pytest.param(gpu(nodeSelector={f"{PREFIX_253}a/gpu": "h100"}), _key_error(f"{PREFIX_253}a/gpu"), id="selector-key-prefix-254"),
    pytest.param(gpu(nodeSelector={NAME_63 + "n": "h100"}), _key_error(NAME_63 + "n"), id="selector-key-name-64"),
    pytest.param(gpu(nodeSelector={"nvidia.com/gpu.product": "NVIDIA H100"}), _value_error("spec.gpu.nodeSelector.nvidia.com/gpu.product", "NVIDIA H100"), id="selector-value-space"),
    pytest.param(gpu(nodeSelector={"pool": "gpu-"}), _value_error("spec.gpu.nodeSelector.pool", "gpu-"), id="selector-value-dash-end"),
    pytest.param(gpu(nodeSelector={"pool": NAME_63 + "n"}), "d.yaml: spec.gpu.nodeSelector.pool: is longer than 63 characters; shorten it to 63 or fewer", id="selector-value-64"),
    pytest.param(gpu(tolerations=[{"key": "gpu", "operator": "Exists"}, {"key": "a b", "operator": "Exists"}]), f"d.yaml: spec.gpu.tolerations[1]: key is not a label key; {LABEL_KEY_FIX}", id="toleration-key"),
    pytest.param(gpu(tolerations=[{"key": "a" * 318}]), "d.yaml: spec.gpu.tolerations[0].key: is longer than 317 characters; shorten it to 317 or fewer", id="toleration-key-long"),
    pytest.param(gpu(tolerations=[{}]), f"d.yaml: spec.gpu.tolerations[0]: {NO_KEY}", id="toleration-empty"),
    pytest.param(gpu(tolerations=[{"operator": "Equal", "value": "x"}]), f"d.yaml: spec.gpu.tolerations[0]: {NO_KEY}", id="toleration-no-key-equal"),
    pytest.param(gpu(tolerations=[{"key": "", "effect": "NoSchedule"}]), f"d.yaml: spec.gpu.tolerations[0]: {NO_KEY}", id="toleration-empty-key-no-operator"),
    pytest.param(gpu(tolerations=[{"key": "gpu", "operator": "Exists", "value": "yes"}]), "d.yaml: spec.gpu.tolerations[0]: operator Exists takes no value; remove value, or use operator: Equal", id="toleration-exists-with-value"),
    pytest.param(gpu(tolerations=[{"key": "gpu", "value": "a b"}]), _value_error("spec.gpu.tolerations[0].value", "a b"), id="toleration-value"),
    pytest.param(gpu(tolerations=[{"key": "gpu", "operator": "In"}]), f"d.yaml: spec.gpu.tolerations[0].operator: 'In' does not match ^(Exists|Equal)$; {OPERATOR_FIX}", id="toleration-operator"),
    pytest.param(gpu(tolerations=[{"key": "gpu", "effect": "NoScheduling"}]), f"d.yaml: spec.gpu.tolerations[0].effect: 'NoScheduling' does not match ^(NoSchedule|PreferNoSchedule|NoExecute)?$; {EFFECT_FIX}", id="toleration-effect"),
    pytest.param(gpu(tolerations=[{"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 60}]), "d.yaml: spec.gpu.tolerations[0]: tolerationSeconds applies only to effect NoExecute; set effect: NoExecute, or remove tolerationSeconds", id="toleration-seconds-not-no-execute"),
    pytest.param(gpu(tolerations=[{"key": "gpu", "operator": "Exists"}] * 65), "d.yaml: spec.gpu.tolerations: has 65 items, more than 64; keep at most 64", id="toleration-count"),
    pytest.param(gpu(nodeSelector={f"k{i}": "v" for i in range(65)}), "d.yaml: spec.gpu.nodeSelector: has 65 entries, more than 64; keep at most 64", id="selector-count"),
    pytest.param(gpu(topologyKey="host name"), f"d.yaml: spec.gpu.topologyKey: is not a label key; {LABEL_KEY_FIX}", id="topology-key"),
    pytest.param(gpu(topologyKey="zone/"), f"d.yaml: spec.gpu.topologyKey: is not a label key; {LABEL_KEY_FIX}", id="topology-key-empty-name"),
    pytest.param(gpu(topologyKey=f"{PREFIX_253}a/zone"), f"d.yaml: spec.gpu.topologyKey: is not a label key; {LABEL_KEY_FIX}", id="topology-key-prefix-254"),
    pytest.param(gpu(resourceName="gpu"), f"d.yaml: spec.gpu.resourceName: {RESOURCE_NAME_REASON}; {RESOURCE_NAME_FIX}", id="resource-name-no-domain"),
    pytest.param(gpu(resourceName="nvidia.com/gpu count"), f"d.yaml: spec.gpu.resourceName: {RESOURCE_NAME_REASON}; {RESOURCE_NAME_FIX}", id="resource-name-space"),
    pytest.param(gpu(resourceName=f"{PREFIX_253}a/gpu"), f"d.yaml: spec.gpu.resourceName: {RESOURCE_NAME_REASON}; {RESOURCE_NAME_FIX}", id="resource-name-prefix-254"),
    pytest.param(model(path="models/qwen"), f"d.yaml: spec.model.path: 'models/qwen' does not match {PATH}; {MODEL_PATH_FIX}", id="model-path-relative"),
    pytest.param(model(path="/models/../etc"), f"d.yaml: spec.model.path: '/models/../etc' does not match {PATH}; {MODEL_PATH_FIX}", id="model-path-up"),
    pytest.param(model(path="/models/q\x00"), f"d.yaml: spec.model.path: {NUL_REASON}; {NUL_FIX}", id="model-path-nul"),
    pytest.param(model(path="/" + "a" * 4096), "d.yaml: spec.model.path: is longer than 4096 characters; shorten it to 4096 or fewer", id="model-path-long"),
    pytest.param(model(source={"type": "hostPath", "hostPath": "mnt/models"}), f"d.yaml: spec.model.source.hostPath: 'mnt/models' does not match {PATH}; {HOST_PATH_FIX}", id="host-path-relative"),
    pytest.param(model(source={"type": "hostPath", "hostPath": "/mnt/models/.."}), f"d.yaml: spec.model.source.hostPath: '/mnt/models/..' does not match {PATH}; {HOST_PATH_FIX}", id="host-path-up"),
    pytest.param(model(source={"type": "hostPath", "hostPath": "/mnt\x00"}), f"d.yaml: spec.model.source.hostPath: {NUL_REASON}; {NUL_FIX}", id="host-path-nul"),
    pytest.param(model(source={"type": "pvc", "claimName": "c", "subPath": "a\x00"}), f"d.yaml: spec.model.source.subPath: {NUL_REASON}; {NUL_FIX}", id="sub-path-nul"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "message"), REFUSED)
def test_refused_with_one_message_naming_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as caught:
        load(spec)
    assert str(caught.value) == message


ADMITTED = [
    pytest.param(gpu(nodeSelector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "", f"{PREFIX_253}/{NAME_63}": NAME_63}), id="selector"),
    pytest.param(gpu(tolerations=[{"operator": "Exists"}]), id="tolerate-everything"),
    pytest.param(gpu(tolerations=[{"key": "", "operator": "Exists", "value": ""}]), id="empty-key-exists"),
    pytest.param(gpu(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]), id="exists"),
    pytest.param(gpu(tolerations=[{"key": "gpu", "value": "h100"}, {"key": "gpu", "operator": "Equal", "value": ""}]), id="equal"),
    pytest.param(gpu(tolerations=[{"key": "gpu", "effect": ""}]), id="every-effect"),
    pytest.param(gpu(tolerations=[{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]), id="seconds"),
    pytest.param(gpu(tolerations=[{"key": "gpu", "operator": "Exists"}] * 64), id="64-tolerations"),
    pytest.param(gpu(topologyKey="topology.kubernetes.io/zone", resourceName="amd.com/gpu"), id="topology-and-resource"),
    pytest.param(gpu(topologyKey="rack", resourceName="gpu.intel.com/i915"), id="topology-without-prefix"),
    pytest.param(gpu(topologyKey=f"{PREFIX_253}/{NAME_63}", resourceName=f"{PREFIX_253}/{NAME_63}"), id="longest-prefix-and-name"),
    pytest.param(model(path="/models/Qwen2.5-Omni-7B/"), id="model-path"),
    pytest.param(model(path="/models/..cache/./x"), id="model-path-dots-in-names"),
    pytest.param(model(source={"type": "hostPath", "hostPath": "/mnt/models"}), id="host-path"),
]  # fmt: skip


@pytest.mark.parametrize("spec", ADMITTED)
def test_what_kubernetes_takes_still_loads(spec: dict[str, Any]) -> None:
    load(spec)
