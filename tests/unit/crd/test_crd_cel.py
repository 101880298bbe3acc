"""CEL rules in the CRD say exactly what the planner says (evaluated with cel-python)."""

from __future__ import annotations

import copy
from pathlib import Path

import celpy
import pytest
import yaml

from omni_operator import crdgen
from omni_operator.api.load import SpecError, parse_deployments
from omni_operator.api.runtime_env import OPERATOR_ENV
from omni_operator.api.spec import OmniDeployment
from omni_operator.plan import PlanError, plan_deployment

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SCHEMA = crdgen.crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _failing_messages(spec: dict) -> list[str]:
    """What the API server says for `spec`: each failing rule's messageExpression, else its message."""
    env = celpy.Environment()
    activation = {"self": celpy.json_to_cel(spec)}
    failing = []
    for rule in SCHEMA["properties"]["spec"]["x-kubernetes-validations"]:
        if not bool(env.program(env.compile(rule["rule"])).evaluate(activation)):
            if "messageExpression" in rule:
                failing.append(str(env.program(env.compile(rule["messageExpression"])).evaluate(activation)))
            else:
                failing.append(rule["message"])
    return failing


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_pass_every_cel_rule(path: Path) -> None:
    assert _failing_messages(yaml.safe_load(path.read_text())["spec"]) == []


CEL_CASES = [
    {"model": {"name": "m", "source": {"type": "tiny"}}, "runtime": {"type": "sglang-omni"}},
    {"model": {"name": "m"}, "runtime": {"type": "vllm-omni"}, "gpu": {"tier": "cpu"}},
    {"model": {"name": "m", "architecture": "minicpm_o", "source": {"type": "tiny"}}, "gpu": {"tier": "cpu"}},
    {"model": {"name": "m"}, "gpu": {"tier": "cpu"}, "stages": {"thinker": {"tensorParallelSize": 2}}},
    {"model": {"name": "m"}, "gpu": {"tier": "cpu"}, "stages": {"imageEncoder": {"placement": "dedicated"}}},
    {"model": {"name": "m"}, "pipeline": "text", "stages": {"talker": {"enabled": True}}},
    {"model": {"name": "m"}, "stages": {"talker": {"enabled": False}}},
    {"model": {"name": "m", "architecture": "qwen3_omni"}, "runtime": {"type": "sglang-omni"}, "pipeline": "duplex"},
    {"model": {"name": "m", "architecture": "qwen2_5_omni"}, "runtime": {"type": "sglang-omni"}},
    {"model": {"name": "m", "architecture": "minicpm_o"}, "runtime": {"type": "sglang-omni"}, "stages": {"imageEncoder": {"placement": "dedicated"}}},
    {"model": {"name": "m", "architecture": "ming_omni"}, "runtime": {"type": "sglang-omni", "version": "0.1.8"}, "stages": {"thinker": {"tensorParallelSize": 4}}},
    {"model": {"name": "m"}, "runtime": {"version": "0.1.9"}},
    {"model": {"name": "m", "architecture": "minicpm_o"}, "runtime": {"type": "vllm-omni"}, "pipeline": "text"},
    {"model": {"name": "m"}, "stages": {"thinker": {"quantization": "fp8"}}},
    {"model": {"name": "m"}, "stages": {"thinker": {"cpuOffloadGb": 4}}},
    {"model": {"name": "m", "architecture": "ming_omni"}, "runtime": {"type": "vllm-omni"}, "pipeline": "streaming-speech", "stages": {"thinker": {"tensorParallelSize": 4}}},
    {"model": {"name": "m", "architecture": "ming_omni"}, "runtime": {"type": "vllm-omni"}, "pipeline": "duplex", "stages": {"thinker": {"tensorParallelSize": 4}}},
    {"model": {"name": "m", "architecture": "qwen3_omni"}, "runtime": {"type": "vllm-omni"}, "stages": {"imageEncoder": {"placement": "dedicated"}}},
    {"model": {"name": "m"}, "stages": {"thinker": {"tensorParallelSize": 4}, "imageEncoder": {"tensorParallelSize": 3}}},
    {"model": {"name": "m"}, "stages": {"thinker": {"tensorParallelSize": 2}, "imageEncoder": {"tensorParallelSize": 4}}},
]  # fmt: skip


@pytest.mark.parametrize("spec", CEL_CASES, ids=range(len(CEL_CASES)))
def test_cel_rejects_what_the_planner_rejects_with_its_message(spec: dict) -> None:
    dep = OmniDeployment.model_validate({"metadata": {"name": "x"}, "spec": copy.deepcopy(spec)})
    with pytest.raises(PlanError) as caught:
        plan_deployment(dep)
    assert _failing_messages(spec) == [str(caught.value)]


def _load(spec: dict) -> None:
    doc = {
        "apiVersion": "omni.dev/v1alpha1",
        "kind": "OmniDeployment",
        "metadata": {"name": "x"},
        "spec": spec,
    }
    parse_deployments(yaml.safe_dump(doc), file="d.yaml")


ENV_CASES = [
    {"MY-VAR": "x"},
    {"OMNI_BUSY_STREAMS": "8", "1ST": "x"},
    {"A B": "x"},
    *({name: "x"} for name in OPERATOR_ENV),
    # the builtin runtime's switches: a flag's or a choice's value
    {"OMNI_PREFILL_GRAPHS": "maybe"},
    {"OMNI_BUSY_STREAMS": "8", "OMNI_SUFFIX_GRAPHS": "enabled"},
    {"OMNI_DECODE_KERNEL": "flash"},
    {"OMNI_VOCODER_DTYPE": "float16"},
    {"OMNI_MOE_EXPERTS": "Grouped_MM"},
]


@pytest.mark.parametrize(
    "env", ENV_CASES, ids=[next(iter(e.keys() - {"OMNI_BUSY_STREAMS"})) for e in ENV_CASES]
)
def test_cel_refuses_a_runtime_env_entry_with_the_loaders_message(env: dict[str, str]) -> None:
    spec = {"model": {"name": "m"}, "runtime": {"env": env}}
    with pytest.raises(SpecError) as caught:
        _load(spec)
    assert _failing_messages(spec) == [str(caught.value).removeprefix("d.yaml: ")]


@pytest.mark.parametrize(
    "spec",
    [{"model": {"name": "m"}}, {"model": {"name": "m"}, "runtime": {}}, {"model": {"name": "m"}, "runtime": {"env": {}}},
     {"model": {"name": "m"}, "runtime": {"env": {"OMNI_BUSY_STREAMS": "8", "_x9": "", "OMP_NUM_THREADS": "2"}}}],
)  # fmt: skip
def test_cel_admits_a_good_or_absent_runtime_env(spec: dict) -> None:
    assert _failing_messages(spec) == []


def test_name_length_rule_matches_the_loader() -> None:
    (rule,) = SCHEMA["x-kubernetes-validations"]
    env = celpy.Environment()
    program = env.program(env.compile(rule["rule"]))
    assert bool(program.evaluate({"self": celpy.json_to_cel({"metadata": {"name": "a" * 40}})}))
    assert not bool(program.evaluate({"self": celpy.json_to_cel({"metadata": {"name": "a" * 41}})}))
    assert rule["message"] == "metadata.name: is longer than 40 characters; shorten it to 40 or fewer"


@pytest.mark.parametrize(
    "env",
    [{"OMNI_PREFILL_GRAPHS": " OFF "}, {"OMNI_SUFFIX_GRAPHS": ""}, {"OMNI_WARM_SPOKEN_AUDIO": "yes"},
     {"OMNI_DECODE_KERNEL": "split"}, {"OMNI_BUSY_STREAMS": "8"}, {"OMNI_VOCODER_FAR": " 0.5 , 4"},
     {"OMNI_VOCODER_BUCKETS": "1,2,4,8,16"}, {"OMNI_STREAM_PRIORITIES": "vocoder=-1, thinker = +2"}],
)  # fmt: skip
def test_cel_admits_what_the_loader_admits_for_the_switches(env: dict[str, str]) -> None:
    spec = {"model": {"name": "m"}, "runtime": {"env": env}}
    _load(spec)
    assert _failing_messages(spec) == []


@pytest.mark.parametrize(
    "env",
    [{"OMNI_BUSY_STREAMS": "many"}, {"OMNI_VOCODER_FAR": "soon"}, {"OMNI_VOCODER_BUCKETS": "1;16"},
     {"OMNI_STREAM_PRIORITIES": "talker=-1,thinkr=-2"}],
)  # fmt: skip
def test_cel_refuses_a_value_switch_off_its_written_form_with_the_loaders_message(
    env: dict[str, str],
) -> None:
    spec = {"model": {"name": "m"}, "runtime": {"env": env}}
    with pytest.raises(SpecError) as caught:
        _load(spec)
    assert _failing_messages(spec) == [str(caught.value).removeprefix("d.yaml: ")]


def test_what_only_a_value_switchs_parser_knows_is_the_loaders_alone() -> None:
    """Buckets in the written form but out of order: kubectl apply admits them, and the operator
    reports the loader's refusal in the deployment's status (README, runtime switches)."""
    spec = {"model": {"name": "m"}, "runtime": {"env": {"OMNI_VOCODER_BUCKETS": "1,8,4,16"}}}
    assert _failing_messages(spec) == []
    with pytest.raises(
        SpecError, match=r"spec.runtime.env.OMNI_VOCODER_BUCKETS: is '1,8,4,16', not batch sizes"
    ):
        _load(spec)


def test_a_peer_runtime_is_not_held_to_the_builtin_switches() -> None:
    assert (
        _failing_messages(
            {
                "model": {"name": "m"},
                "runtime": {"type": "vllm-omni", "env": {"OMNI_PREFILL_GRAPHS": "maybe"}},
            }
        )
        == []
    )


# --- Kubernetes' rules (api/kube_rules.py): the API server says what the loader says ---------------

PREFIX_254 = ("a" * 63 + ".") * 3 + "a" * 62  # 254 characters: one past a label key's prefix


@pytest.mark.parametrize(
    "key", ["gpu type", "Example.com/gpu", "a/b/c", "-gpu", f"{PREFIX_254}/gpu", "n" * 64, "é"]
)
def test_cel_refuses_a_node_selector_key_with_the_loaders_message(key: str) -> None:
    spec = {"model": {"name": "m"}, "gpu": {"nodeSelector": {"pool": "a", key: "b"}}}
    with pytest.raises(SpecError) as caught:
        _load(spec)
    assert _failing_messages(spec) == [str(caught.value).removeprefix("d.yaml: ")]


@pytest.mark.parametrize(
    "gpu",
    [{}, {"nodeSelector": {}}, {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100", "pool": ""}},
     {"nodeSelector": {f"{PREFIX_254[1:]}/{'n' * 63}": "x"}}],
)  # fmt: skip
def test_cel_admits_a_good_or_absent_node_selector(gpu: dict) -> None:
    spec = {"model": {"name": "m"}, "gpu": gpu}
    _load(spec)
    assert _failing_messages(spec) == []


@pytest.mark.parametrize(
    "gpu",
    [{"topologyKey": "host name"}, {"topologyKey": "zone/"}, {"topologyKey": f"{PREFIX_254}/zone"},
     {"resourceName": "gpu"}, {"resourceName": "nvidia.com/gpu count"}, {"resourceName": f"{PREFIX_254}/gpu"}],
)  # fmt: skip
def test_cel_refuses_a_topology_key_or_resource_name_with_the_loaders_message(gpu: dict) -> None:
    spec = {"model": {"name": "m"}, "gpu": gpu}
    with pytest.raises(SpecError) as caught:
        _load(spec)
    assert _failing_messages(spec) == [str(caught.value).removeprefix("d.yaml: ")]


@pytest.mark.parametrize(
    "gpu",
    [{"topologyKey": "topology.kubernetes.io/zone", "resourceName": "amd.com/gpu"}, {"topologyKey": "rack"},
     {"topologyKey": f"{PREFIX_254[1:]}/{'n' * 63}", "resourceName": f"{PREFIX_254[1:]}/{'n' * 63}"}],
)  # fmt: skip
def test_cel_admits_a_topology_key_and_resource_name_the_loader_admits(gpu: dict) -> None:
    spec = {"model": {"name": "m"}, "gpu": gpu}
    _load(spec)
    assert _failing_messages(spec) == []


TOLERATION_SCHEMA = SCHEMA["properties"]["spec"]["properties"]["gpu"]["properties"]["tolerations"]["items"]


def _toleration_messages(toleration: dict) -> list[str]:
    """What the API server says for one toleration by the rules on the toleration (it prefixes the
    item's path, spec.gpu.tolerations[i], as the loader does)."""
    env = celpy.Environment()
    activation = {"self": celpy.json_to_cel(toleration)}
    return [
        rule["message"]
        for rule in TOLERATION_SCHEMA["x-kubernetes-validations"]
        if not bool(env.program(env.compile(rule["rule"])).evaluate(activation))
    ]


@pytest.mark.parametrize(
    "toleration",
    [{}, {"operator": "Equal", "value": "x"}, {"key": "", "effect": "NoSchedule"}, {"key": "gpu type"},
     {"key": "Example.com/gpu", "operator": "Exists"}, {"key": f"{PREFIX_254}/gpu", "operator": "Exists"},
     {"key": "gpu", "operator": "Exists", "value": "yes"},
     {"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 60}, {"key": "gpu", "tolerationSeconds": 0}],
)  # fmt: skip
def test_cel_refuses_a_toleration_with_the_loaders_message(toleration: dict) -> None:
    spec = {"model": {"name": "m"}, "gpu": {"tolerations": [{"operator": "Exists"}, toleration]}}
    with pytest.raises(SpecError) as caught:
        _load(spec)
    assert _toleration_messages(toleration) == [
        str(caught.value).removeprefix("d.yaml: spec.gpu.tolerations[1]: ")
    ]


@pytest.mark.parametrize(
    "toleration",
    [{"operator": "Exists"}, {"key": "", "operator": "Exists", "value": ""},
     {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, {"key": "gpu", "value": "h100"},
     {"key": "gpu", "operator": "Equal", "value": "", "effect": ""},
     {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
)  # fmt: skip
def test_cel_admits_what_the_loader_admits_for_a_toleration(toleration: dict) -> None:
    _load({"model": {"name": "m"}, "gpu": {"tolerations": [toleration]}})
    assert _toleration_messages(toleration) == []
