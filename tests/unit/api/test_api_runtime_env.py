"""spec.runtime.env in the loader: names that are environment variable names and not the operator's
own load; any other is refused with one message naming spec.runtime.env.NAME and the fix."""

from __future__ import annotations

import pytest

from omni_operator.api.load import SpecError, parse_deployments
from omni_operator.api.runtime_env import OPERATOR_ENV
from omni_operator.api.spec import RuntimeSpec

HEAD = "apiVersion: omni.dev/v1alpha1\nkind: OmniDeployment\nmetadata:\n  name: demo\nspec:\n  model: {name: x}\n"


def _load(env: str) -> RuntimeSpec:
    (dep,) = parse_deployments(HEAD + f"  runtime:\n    env: {env}\n", file="d.yaml")
    return dep.spec.runtime


def test_env_loads_in_file_order_and_defaults_to_empty() -> None:
    runtime = _load("{OMNI_BUSY_STREAMS: '8', OMNI_SUFFIX_GRAPHS: '1', _private2: '', OMP_NUM_THREADS: '4'}")
    assert runtime.env == {
        "OMNI_BUSY_STREAMS": "8",
        "OMNI_SUFFIX_GRAPHS": "1",
        "_private2": "",
        "OMP_NUM_THREADS": "4",
    }
    assert list(runtime.env) == ["OMNI_BUSY_STREAMS", "OMNI_SUFFIX_GRAPHS", "_private2", "OMP_NUM_THREADS"]
    (dep,) = parse_deployments(HEAD, file="d.yaml")
    assert dep.spec.runtime.env == {}


NAME_FIX = "is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*); use letters, digits and _, not starting with a digit"

REFUSED = [
    pytest.param("{MY-VAR: x}", f"d.yaml: spec.runtime.env.MY-VAR: {NAME_FIX}", id="dash"),
    pytest.param("{1ST: x}", f"d.yaml: spec.runtime.env.1ST: {NAME_FIX}", id="leading-digit"),
    pytest.param("{'A B': x}", f"d.yaml: spec.runtime.env.A B: {NAME_FIX}", id="space"),
    pytest.param("{OMNI.X: x}", f"d.yaml: spec.runtime.env.OMNI.X: {NAME_FIX}", id="dot"),
    pytest.param(
        "{HOME: /home/omni}",
        "d.yaml: spec.runtime.env.HOME: is set by the operator (a writable home beside the read-only root "
        "filesystem); remove it from runtime.env",
        id="home",
    ),
    pytest.param(
        "{OMNI_CACHE_DIR: /data}",
        "d.yaml: spec.runtime.env.OMNI_CACHE_DIR: is set by the operator (the pod's writable cache volume); "
        "remove it from runtime.env",
        id="cache-dir",
    ),
    pytest.param(
        "{OMNI_BUSY_STREAMS: '8', CUDA_VISIBLE_DEVICES: '0'}",
        "d.yaml: spec.runtime.env.CUDA_VISIBLE_DEVICES: is set by the operator (the GPUs the plan gives each "
        "process); remove it from runtime.env",
        id="gpus",
    ),
    pytest.param(
        "{MASTER_PORT: '1234', X-Y: z}",
        "d.yaml: spec.runtime.env.MASTER_PORT: is set by the operator (the rendezvous of a thinker spread over "
        "several nodes); remove it from runtime.env",
        id="first-in-file-order",
    ),
    pytest.param(
        "{OMNI_BUSY_STREAMS: 8}",
        "d.yaml: spec.runtime.env.OMNI_BUSY_STREAMS: expected a string, got 8; quote it: OMNI_BUSY_STREAMS: '8'",
        id="unquoted-number",
    ),
    pytest.param(
        "{OMNI_SUFFIX_GRAPHS: on}",
        "d.yaml: spec.runtime.env.OMNI_SUFFIX_GRAPHS: expected a string, got True; quote it: OMNI_SUFFIX_GRAPHS: 'true'",
        id="unquoted-boolean",
    ),
    pytest.param(
        "{OMNI_PREFILL_GRAPHS: 'maybe'}",
        "d.yaml: spec.runtime.env.OMNI_PREFILL_GRAPHS: is 'maybe', not a flag; use 1 or 0 (on/off, true/false "
        "and yes/no work too)",
        id="switch-flag",
    ),
    pytest.param(
        "{OMNI_DECODE_KERNEL: flash}",
        "d.yaml: spec.runtime.env.OMNI_DECODE_KERNEL: is 'flash'; use one of sdpa, split",
        id="switch-choice",
    ),
    pytest.param(
        "{OMNI_BUSY_STREAM: '8'}",
        "d.yaml: spec.runtime.env.OMNI_BUSY_STREAM: is not one of the builtin runtime's switches; did you mean "
        "OMNI_BUSY_STREAMS?",
        id="switch-typo",
    ),
    pytest.param(
        "{OMNI_VOCODER_FAR: soon}",
        "d.yaml: spec.runtime.env.OMNI_VOCODER_FAR: is 'soon', not SECONDS,WINDOWS[,near] or off (seconds of audio "
        "left >= 0, windows per call >= 1); use e.g. 1.0,4,near",
        id="switch-value-format",
    ),
    pytest.param("[OMNI_BUSY_STREAMS]", "d.yaml: spec.runtime.env: expected a mapping, got ['OMNI_BUSY_STREAMS']; "
                 "set env to a mapping", id="list"),
    pytest.param("{X: " + "a" * 4097 + "}", "d.yaml: spec.runtime.env.X: is longer than 4096 characters; shorten "
                 "it to 4096 or fewer", id="too-long"),  # the CRD's maxLength too (it bounds CEL's cost)
]  # fmt: skip


@pytest.mark.parametrize(("env", "message"), REFUSED)
def test_refused_env_says_which_name_and_the_fix(env: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        _load(env)
    assert str(caught.value) == message


def test_the_error_names_the_entry_as_its_field() -> None:
    with pytest.raises(SpecError) as caught:
        _load("{HF_HOME: /hf}")
    err = caught.value
    assert (err.field, err.reason, err.fix) == (
        "spec.runtime.env.HF_HOME",
        "is set by the operator (a cache in the pod's writable cache volume)",
        "remove it from runtime.env",
    )


def test_every_operator_name_is_refused_and_listed_in_the_field_description() -> None:
    description = RuntimeSpec.model_fields["env"].description or ""
    for name in OPERATOR_ENV:
        with pytest.raises(SpecError, match=f"spec.runtime.env.{name}: is set by the operator"):
            _load(f"{{{name}: x}}")
        assert name in description
    assert "OMNI_BUSY_STREAMS" in description and "roll" in description


def test_a_peer_runtime_takes_omni_names_as_they_are() -> None:
    """The builtin runtime's switches are checked only for it: sglang-omni and vllm-omni read none."""
    (dep,) = parse_deployments(
        HEAD
        + "  runtime:\n    type: vllm-omni\n    env: {OMNI_PREFILL_GRAPHS: maybe, OMNI_BUSY_STREAM: '8'}\n",
        file="d.yaml",
    )
    assert dep.spec.runtime.env == {"OMNI_PREFILL_GRAPHS": "maybe", "OMNI_BUSY_STREAM": "8"}
