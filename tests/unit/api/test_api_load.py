"""Loading OmniDeployments from YAML: every problem is one message with file, field, reason and fix."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from omni_operator.api.load import SpecError, load_deployments, parse_deployments
from omni_operator.api.spec import PipelineVariant

HEAD = "apiVersion: omni.dev/v1alpha1\nkind: OmniDeployment\nmetadata:\n  name: demo\n"
PIPELINES = "'text', 'speech', 'streaming-speech' or 'duplex'"
KEEP_ONE = "keep one of them: YAML would silently use the last"

CASES = [
    pytest.param(
        HEAD + "spec:\n  model:\n    name: [x\n",
        "d.yaml:8: malformed YAML: expected ',' or ']', but got '<stream end>'; fix the YAML syntax on that line",
        id="malformed-flow-list",
    ),
    pytest.param(
        HEAD + "spec:\n\tmodel: {}\n",
        "d.yaml:6: malformed YAML: found character '\\t' that cannot start any token; fix the YAML syntax on that line",
        id="tab-indent",
    ),
    pytest.param(
        HEAD + "spec:\n  model:\n    name: x\n  stages:\n    thinker:\n      tensorParalelSize: 2\n",
        "d.yaml: spec.stages.thinker.tensorParalelSize: unknown field 'tensorParalelSize'; did you mean "
        "tensorParallelSize? fields of spec.stages.thinker: tensorParallelSize, memFractionStatic, cpuOffloadGb, "
        "quantization, resources, image, args",
        id="unknown-field-typo",
    ),
    pytest.param(
        HEAD + "spec:\n  model:\n    name: x\n  zzz: 1\n",
        "d.yaml: spec.zzz: unknown field 'zzz'; remove it; fields of spec: model, runtime, pipeline, workers, "
        "stages, gpu, router, rollout, media, streamingInput, speech, sessionKv",
        id="unknown-field",
    ),
    pytest.param(
        HEAD + "spec:\n  model:\n    name: x\n  stages:\n    thinker:\n      tensorParallelSize: four\n",
        "d.yaml: spec.stages.thinker.tensorParallelSize: expected a whole number, got 'four'; set "
        "tensorParallelSize to a whole number",
        id="wrong-type-int",
    ),
    pytest.param(
        HEAD + "spec:\n  model:\n    name: x\n  workers: 1.5\n",
        "d.yaml: spec.workers: expected a whole number, got 1.5; set workers to a whole number",
        id="fractional-workers",
    ),
    pytest.param(
        HEAD + "spec:\n  model: {name: x, trustRemoteCode: maybe}\n",
        "d.yaml: spec.model.trustRemoteCode: expected true or false, got 'maybe'; set trustRemoteCode to true or false",
        id="wrong-type-bool",
    ),
    pytest.param(
        HEAD + "spec:\n  model: {name: x}\n  stages: 3\n",
        "d.yaml: spec.stages: expected a mapping, got 3; set stages to a mapping",
        id="wrong-type-object",
    ),
    pytest.param(
        HEAD + "spec:\n  model:\n    name: x\n  pipeline: speach\n",
        f"d.yaml: spec.pipeline: 'speach' is not a valid pipeline; use one of {PIPELINES}",
        id="enum",
    ),
    pytest.param(
        HEAD + "spec:\n  workers: 1\n",
        "d.yaml: spec.model: required field is missing; add model",
        id="missing",
    ),
    pytest.param(HEAD, "d.yaml: spec: required field is missing; add spec", id="missing-spec"),
    pytest.param(
        HEAD + "spec:\n  model:\n    name: x\n  workers: -1\n",
        "d.yaml: spec.workers: -1 is below the minimum 0; use a value >= 0",
        id="below-minimum",
    ),
    pytest.param(
        HEAD + "spec:\n  model: {name: x}\n  stages: {thinker: {memFractionStatic: 1.5}}\n",
        "d.yaml: spec.stages.thinker.memFractionStatic: 1.5 is not below the bound 1.0; use a value < 1.0",
        id="above-exclusive-maximum",
    ),
    pytest.param(
        HEAD + "spec:\n  model:\n    name: x\n    source:\n      type: pvc\n",
        "d.yaml: spec.model.source: claimName is required when type is pvc; set claimName to the "
        "PersistentVolumeClaim holding the checkpoint",
        id="pvc-without-claim",
    ),
    pytest.param(
        HEAD + "spec:\n  model: {name: x}\n  rollout:\n    maxSurge: 0\n",
        "d.yaml: spec.rollout: rollout.maxSurge and rollout.maxUnavailable are both 0: a rollout could never "
        "progress; set maxSurge: 1 (default) or maxUnavailable: 1",
        id="rollout-stuck",
    ),
    pytest.param(
        "apiVersion: omni.dev/v1alpha1\nkind: Deployment\nmetadata: {name: x}\nspec: {}\n",
        "d.yaml: kind: 'Deployment' is not OmniDeployment; set kind: OmniDeployment",
        id="wrong-kind",
    ),
    pytest.param(
        "apiVersion: apps/v1\nkind: OmniDeployment\n",
        "d.yaml: apiVersion: 'apps/v1' is not omni.dev/v1alpha1; set apiVersion: omni.dev/v1alpha1",
        id="wrong-api-version",
    ),
    pytest.param(
        "- a\n- b\n",
        "d.yaml: expected an OmniDeployment mapping, got a list; start the document with apiVersion, kind, "
        "metadata and spec",
        id="not-a-mapping",
    ),
    pytest.param("", "d.yaml: no OmniDeployment found; write one (see examples/)", id="empty"),
    pytest.param(
        "metadata:\n  name: Demo_1\nspec:\n  model: {name: x}\n",
        "d.yaml: metadata.name: 'Demo_1' does not match ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$; use lowercase letters, "
        "digits and '-', starting and ending with a letter or digit",
        id="bad-name",
    ),
    pytest.param(
        "metadata:\n  name: " + "a" * 41 + "\nspec:\n  model: {name: x}\n",
        "d.yaml: metadata.name: is longer than 40 characters; shorten it to 40 or fewer",
        id="long-name",
    ),
    pytest.param(
        HEAD + "spec:\n  model: {name: x}\n---\n" + HEAD + "spec:\n  model: {name: x}\n  gpu: {tier: h900}\n",
        "d.yaml (document 2): spec.gpu.tier: 'h900' is not a valid tier; use one of 'cpu', 'a100-40gb', "
        "'a100-80gb', 'l40s', 'h100', 'h200' or 'b200'",
        id="second-document",
    ),
    pytest.param(
        HEAD + "spec:\n  model: {name: x}\n  gpu:\n    tolerations:\n    - key: a\n      effect: Sometimes\n",
        "d.yaml: spec.gpu.tolerations[0].effect: 'Sometimes' does not match ^(NoSchedule|PreferNoSchedule|NoExecute)?$; "
        "use NoSchedule, PreferNoSchedule or NoExecute, or '' for every effect",
        id="list-index-in-path",
    ),
    pytest.param(
        HEAD + "spec:\n  model: {name: x}\n  workers: 1\n  workers: 2\n",
        f"d.yaml:8: spec.workers: duplicate key 'workers' (first on line 7); {KEEP_ONE}",
        id="duplicate-key",
    ),
    pytest.param(
        HEAD + "spec:\n  model: {name: x, name: y}\n",
        f"d.yaml:6: spec.model.name: duplicate key 'name' (first on line 6); {KEEP_ONE}",
        id="duplicate-key-in-a-flow-mapping",
    ),
    pytest.param(
        HEAD + "metadata: {name: b}\nspec:\n  model: {name: x}\n",
        f"d.yaml:5: metadata: duplicate key 'metadata' (first on line 3); {KEEP_ONE}",
        id="duplicate-top-level-key",
    ),
    pytest.param(
        HEAD + "spec:\n  model: {name: x}\n  gpu:\n    tolerations:\n    - key: a\n      key: b\n",
        f"d.yaml:10: spec.gpu.tolerations[0].key: duplicate key 'key' (first on line 9); {KEEP_ONE}",
        id="duplicate-key-in-a-list-item",
    ),
    pytest.param(
        HEAD + "spec:\n  model: {name: x}\n  runtime:\n    env:\n      0x1: a\n      1: b\n",
        f"d.yaml:10: spec.runtime.env.1: duplicate key '1' (first on line 9); {KEEP_ONE}",
        id="duplicate-key-written-two-ways",
    ),
    pytest.param(
        HEAD + "spec:\n  model: {name: x}\n---\n" + HEAD + "spec:\n  pipeline: text\n  pipeline: speech\n",
        f"d.yaml:14: spec.pipeline: duplicate key 'pipeline' (first on line 13); {KEEP_ONE}",
        id="duplicate-key-in-the-second-document",
    ),
    pytest.param(
        "base: &b {name: x, name: y}\n" + HEAD + "spec:\n  model: *b\n",
        f"d.yaml:1: base.name: duplicate key 'name' (first on line 1); {KEEP_ONE}",
        id="duplicate-key-in-an-anchor",
    ),
    pytest.param(
        HEAD + "spec:\n  model: {name: x}\n  workers: -1\n  pipeline: x\n",
        f"d.yaml: spec.pipeline: 'x' is not a valid pipeline; use one of {PIPELINES} (1 more problem after this one)",
        id="first-of-several",
    ),
]


@pytest.mark.parametrize(("text", "message"), CASES)
def test_bad_input_message(text: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_deployments(text, file="d.yaml")
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "base: &b {name: x, path: /m}\n" + HEAD + "spec:\n  model:\n    <<: *b\n    name: y\n",
            {"model.name": "y", "model.path": "/m"},
            id="a merged key overridden",
        ),
        pytest.param(
            "base: &b {name: x}\n" + HEAD + "spec:\n  model:\n    <<: [*b, {name: z, path: /m}]\n",
            {"model.name": "x", "model.path": "/m"},
            id="a key in two merged mappings",
        ),
        pytest.param(
            HEAD + "spec:\n  model: {name: x}\n  runtime:\n    env: {A: '1', a: '2'}\n",
            {"runtime.env": {"A": "1", "a": "2"}},
            id="keys that differ in case",
        ),
        pytest.param(
            HEAD
            + "spec:\n  model: {name: name}\n  stages: {thinker: {image: 'a:1'}, talker: {image: 'b:1'}}\n",
            {"model.name": "name", "stages.thinker.image": "a:1", "stages.talker.image": "b:1"},
            id="one key in sibling mappings",
        ),
    ],
)
def test_repeated_names_that_are_not_duplicate_keys_load(text: str, expected: dict[str, object]) -> None:
    (dep,) = parse_deployments(text, file="d.yaml")
    assert {a: functools.reduce(getattr, a.split("."), dep.spec) for a in expected} == expected


def test_field_reason_fix_are_separate() -> None:
    with pytest.raises(SpecError) as caught:
        parse_deployments(HEAD + "spec:\n  model:\n    name: x\n  workers: -1\n", file="d.yaml")
    err = caught.value
    assert (err.file, err.field, err.reason, err.fix, err.line) == (
        "d.yaml",
        "spec.workers",
        "-1 is below the minimum 0",
        "use a value >= 0",
        None,
    )


def test_loads_every_document_with_defaults(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(
        HEAD
        + "spec:\n  model: {name: a}\n---\n# comment only\n---\n"
        + HEAD
        + "spec:\n  model: {name: b}\n  pipeline: text\n"
    )
    first, second = load_deployments(path)
    assert (first.spec.model.name, second.spec.model.name) == ("a", "b")
    assert (first.spec.pipeline, second.spec.pipeline) == (PipelineVariant.speech, PipelineVariant.text)
    assert first.metadata.namespace == "default"
    assert first.spec.stages.thinker.tensor_parallel_size == 1


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as caught:
        load_deployments(missing)
    assert str(caught.value) == f"{missing}: file not found; check the path"


def test_examples_all_load() -> None:
    examples = sorted((Path(__file__).resolve().parents[3] / "examples").glob("*.yaml"))
    names = [load_deployments(p)[0].metadata.name for p in examples]
    assert names == [
        "ming-speech",
        "ming-streaming",
        "ming-text",
        "ming-vision",
        "ming-vllm",
        "minicpm-duplex-sglang",
        "minicpm-duplex-vllm",
        "minicpm-duplex",
        "qwen25-omni",
        "qwen25-omni-vllm",
        "qwen3-omni-builtin-duplex",
        "qwen3-omni-builtin",
        "qwen3-omni-builtin-tp2",
        "qwen3-omni-sglang",
        "qwen3-omni-duplex",
        "qwen3-omni-streaming",
        "qwen3-omni",
        "tiny-omni",
        "tiny-qwen3",
    ]
