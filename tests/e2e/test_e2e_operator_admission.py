"""Invalid specs are rejected at apply time (CEL rules in the generated CRD carry the planner's
messages); specs only the planner can judge (GPU memory arithmetic) and clusters too small for a
spec show up as condition reasons, never as a silent Pending."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml
from e2e_cluster import ControlPlane
from e2e_operator import Api, condition, deployment, gpu_request, running_operator

pytestmark = pytest.mark.e2e

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_is_admitted(crds: ControlPlane, namespace: str, example: Path) -> None:
    """Every example passes the CRD's schema and CEL rules on a real API server (server dry run)."""
    result = crds.kubectl("apply", "-n", namespace, "--dry-run=server", "-f", str(example), check=False)
    assert result.returncode == 0, result.stderr


def test_impossible_spec_is_rejected_at_apply_with_the_planners_message(
    crds: ControlPlane, namespace: str
) -> None:
    bad = deployment("bad", spec={"pipeline": "text", "stages": {"talker": {"enabled": True}}})
    result = crds.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert result.returncode != 0
    assert (
        "spec.stages.talker.enabled: the text pipeline launches no talker; use pipeline: speech, "
        "or remove stages.talker.enabled" in result.stderr
    )
    assert crds.kubectl("get", "omnideployments", "-n", namespace, "-o", "name").stdout.strip() == ""


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"OMNI_BUSY_STREAMS": "8", "MY-VAR": "x"},
            "spec.runtime.env.MY-VAR: is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*); "
            "use letters, digits and _, not starting with a digit",
        ),
        (
            {"HOME": "/home/omni"},
            "spec.runtime.env.HOME: is set by the operator (a writable home beside the read-only root "
            "filesystem); remove it from runtime.env",
        ),
        (
            {"OMNI_PREFILL_GRAPHS": "maybe"},
            "spec.runtime.env.OMNI_PREFILL_GRAPHS: is 'maybe', not a flag; use 1 or 0 (on/off, true/false and "
            "yes/no work too)",
        ),
        (
            {"OMNI_DECODE_KERNEL": "flash"},
            "spec.runtime.env.OMNI_DECODE_KERNEL: is 'flash'; use one of sdpa, split",
        ),
        (
            {"OMNI_VOCODER_FAR": "soon"},
            "spec.runtime.env.OMNI_VOCODER_FAR: is 'soon', not SECONDS,WINDOWS[,near] or off (seconds of audio "
            "left >= 0, windows per call >= 1); use e.g. 1.0,4,near",
        ),
        (
            {"OMNI_STREAM_PRIORITIES": "talker=-1,thinkr=-2"},
            "spec.runtime.env.OMNI_STREAM_PRIORITIES: is 'talker=-1,thinkr=-2', not stage=integer pairs",
        ),
    ],
    ids=["bad-name", "operator-name", "switch-flag", "switch-choice", "switch-value", "switch-priorities"],
)
def test_runtime_env_is_refused_at_apply_with_the_loaders_message(
    crds: ControlPlane, namespace: str, env: dict[str, str], message: str
) -> None:
    """The CRD's rules on spec.runtime.env (one with a message expression naming the variable) pass
    the API server's cost check and say what `omni plan` says; a good env is admitted."""
    bad = deployment("badenv", spec={"runtime": {"env": env}})
    result = crds.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert result.returncode != 0
    assert message in result.stderr
    good = deployment(
        "goodenv",
        spec={
            "runtime": {
                "env": {
                    "OMNI_BUSY_STREAMS": "8",
                    "_X1": "",
                    "OMNI_SUFFIX_GRAPHS": "On",
                    "OMNI_VOCODER_FAR": " 1.5, 4",
                    "OMNI_STREAM_PRIORITIES": "thinker=-2, talker = -1",
                    "OMNI_VOCODER_BUCKETS": "",
                }
            }
        },
    )
    result = crds.kubectl(
        "apply", "-n", namespace, "--dry-run=server", "-f", "-", input=yaml.safe_dump(good), check=False
    )
    assert result.returncode == 0, result.stderr


def test_spec_that_does_not_fit_its_gpus_is_an_invalid_spec_condition(
    crds: ControlPlane, api: Api, namespace: str
) -> None:
    with running_operator(crds, namespace):
        api.create(
            deployment(
                "toobig",
                workers=1,
                spec={
                    "model": {"name": "Qwen3-Omni-30B-A3B-Instruct", "architecture": "qwen3_omni"},
                    "gpu": {"tier": "a100-40gb"},
                },
            )
        )
        status = api.wait_status("toobig", "Failed", lambda st: st.get("phase") == "Failed")
        degraded = condition(status, "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
        assert degraded["message"].startswith(
            "spec.stages.thinker.tensorParallelSize: the qwen3_omni thinker does not fit"
        )
        assert degraded["message"].endswith("set tensorParallelSize: 2 (30.5 GB per GPU)")
        assert api.pods("toobig") == []
        assert [e["message"] for e in api.events() if e["reason"] == "InvalidSpec"] == [degraded["message"]]


def test_too_few_gpus_is_a_condition_reason(crds: ControlPlane, api: Api, namespace: str) -> None:
    # 5 workers x (8-GPU thinker + 1-GPU talker) = 45 GPUs; the cluster has 4 x 8 = 32.
    with running_operator(crds, namespace):
        api.create(deployment("greedy", workers=5, tp=8))
        status = api.wait_status(
            "greedy",
            "Degraded for lack of GPUs",
            lambda st: any(
                c["type"] == "Degraded" and c["reason"] == "InsufficientGPUs"
                for c in st.get("conditions", [])
            ),
        )
        message = condition(status, "Degraded")["message"]
        assert "cannot be scheduled for lack of nvidia.com/gpu" in message
        assert "Insufficient nvidia.com/gpu" in message
        assert status["phase"] in ("Degraded", "Pending")
        assert status["workers"]["ready"] < 5
        per_node: Counter[str] = Counter()
        for pod in api.pods("greedy"):
            if pod["spec"].get("nodeName"):
                per_node[pod["spec"]["nodeName"]] += gpu_request(pod)
        assert per_node and max(per_node.values()) <= 8
        assert any(e["reason"] == "InsufficientGPUs" and e["type"] == "Warning" for e in api.events())
