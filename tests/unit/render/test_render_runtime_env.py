"""spec.runtime.env in the rendered pods: on every stage container of every worker (any runtime),
never on the router; a changed value is a new pod template, so the workers roll. And every name the
operator writes itself is one the spec may not set (api/runtime_env.OPERATOR_ENV)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from omni_operator.api.load import parse_deployments
from omni_operator.api.runtime_env import OPERATOR_ENV
from omni_operator.api.spec import OmniDeployment
from omni_operator.plan import adapters, plan_deployment
from omni_operator.render import render_manifests

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
K8S_VERSION = kubernetes_validate.utils.latest_version()
SWITCHES = {"OMNI_BUSY_STREAMS": "8", "OMNI_SUFFIX_GRAPHS": "1"}
CACHES = [
    {"name": "OMNI_CACHE_DIR", "value": "/var/cache/omni"},
    {"name": "HF_HOME", "value": "/var/cache/omni/hf"},
    {"name": "HOME", "value": "/tmp"},
]


def _example(name: str, env: dict[str, str] | None = None, *, workers: int | None = None) -> OmniDeployment:
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    if env is not None:
        doc["spec"].setdefault("runtime", {})["env"] = env
    if workers is not None:
        doc["spec"]["workers"] = workers
    (dep,) = parse_deployments(yaml.safe_dump(doc, sort_keys=False), file=name)
    return dep


def _pods(dep: OmniDeployment) -> dict[str, dict[str, Any]]:
    manifests = render_manifests(plan_deployment(dep))
    for manifest in manifests:
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] in ("Pod", "Deployment")}


def _env(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]["template"]["spec"] if obj["kind"] == "Deployment" else obj["spec"]
    (container,) = spec["containers"]
    return container["env"]


def test_every_stage_container_of_every_worker_gets_the_env_and_the_router_none() -> None:
    pods = _pods(_example("qwen2.5-omni-7b-h100.yaml", SWITCHES, workers=2))
    set_ = [{"name": k, "value": v} for k, v in SWITCHES.items()]
    assert sorted(pods) == [
        "qwen25-omni",
        *(f"qwen25-omni-w{i}-{role}" for i in range(2) for role in ("api", "talker", "thinker")),
    ]
    for worker in ("qwen25-omni-w0", "qwen25-omni-w1"):
        assert _env(pods[f"{worker}-api"]) == [*set_, {"name": "OMP_NUM_THREADS", "value": "2"}, *CACHES]
        assert _env(pods[f"{worker}-thinker"]) == [*set_, *CACHES]
        assert _env(pods[f"{worker}-talker"]) == [*set_, *CACHES]
    # The router is its own process and reads none of the runtime's switches.
    router = _env(pods["qwen25-omni"])
    assert router == _env(_pods(_example("qwen2.5-omni-7b-h100.yaml", workers=2))["qwen25-omni"])
    assert not {e["name"] for e in router} & SWITCHES.keys()


def test_a_peer_runtime_worker_pod_gets_the_env_beside_its_caches() -> None:
    pods = _pods(_example("qwen3-omni-vllm.yaml", {"VLLM_LOGGING_LEVEL": "DEBUG"}))
    for worker in ("qwen3-omni-w0", "qwen3-omni-w1"):
        assert [e["name"] for e in _env(pods[f"{worker}-worker"])] == [
            "VLLM_LOGGING_LEVEL",
            "OMNI_CACHE_DIR",
            "HF_HOME",
            "HOME",
            "XDG_CACHE_HOME",
            "TRITON_CACHE_DIR",
            "TORCHINDUCTOR_CACHE_DIR",
        ]


def test_omp_num_threads_from_the_spec_replaces_the_cpu_limit_default() -> None:
    (pod,) = (
        p
        for n, p in _pods(_example("tiny-cpu.yaml", {"OMP_NUM_THREADS": "4"})).items()
        if n.endswith("w0-worker")
    )
    assert _env(pod) == [{"name": "OMP_NUM_THREADS", "value": "4"}, *CACHES]


def _revisions(pods: dict[str, dict[str, Any]]) -> dict[str, tuple[str, str]]:
    return {
        name: (
            pod["metadata"]["labels"]["omni.dev/revision"],
            pod["metadata"]["annotations"]["omni.dev/pod-revision"],
        )
        for name, pod in pods.items()
        if pod["kind"] == "Pod"
    }


def test_a_changed_value_changes_every_stage_pods_revision() -> None:
    before = _revisions(_pods(_example("qwen2.5-omni-7b-h100.yaml", {"OMNI_BUSY_STREAMS": "8"})))
    after = _revisions(_pods(_example("qwen2.5-omni-7b-h100.yaml", {"OMNI_BUSY_STREAMS": "4"})))
    unset = _revisions(_pods(_example("qwen2.5-omni-7b-h100.yaml")))
    assert before.keys() == after.keys() == unset.keys()
    for name in before:
        # A new worker revision (a rollout, worker by worker) and a new template for every role.
        assert len({before[name][0], after[name][0], unset[name][0]}) == 3, name
        assert len({before[name][1], after[name][1], unset[name][1]}) == 3, name


def _multi_node() -> OmniDeployment:
    spec = {
        "model": {"name": "m", "thinkerParamsBillions": 400},
        "stages": {"thinker": {"tensorParallelSize": 16}},
    }
    return OmniDeployment.model_validate({"metadata": {"name": "big"}, "spec": spec})


@pytest.mark.parametrize("dep", [*(_example(p.name) for p in sorted(EXAMPLES.glob("*.yaml"))), _multi_node()],
                         ids=[*(p.stem for p in sorted(EXAMPLES.glob("*.yaml"))), "multi-node-thinker"])  # fmt: skip
def test_every_name_the_operator_sets_on_a_stage_pod_is_refused_in_the_spec(dep: OmniDeployment) -> None:
    """OMP_NUM_THREADS is the one name both write: the renderer only when the spec leaves it unset."""
    written = {e["name"] for name, pod in _pods(dep).items() if pod["kind"] == "Pod" for e in _env(pod)}
    assert written - {"OMP_NUM_THREADS"} <= OPERATOR_ENV.keys()


def test_vllm_omnis_deploy_dir_variable_is_refused_in_the_spec() -> None:
    # Set by the worker command's shell prelude, not in the pod's env list.
    assert adapters.VLLM_DEPLOY_DIR_ENV in OPERATOR_ENV


def _kubelet_expand(value: str, defined: dict[str, str]) -> str:
    """The kubelet's expansion of a container env value (Kubernetes' third_party/forked/golang/
    expansion): ``$$`` is one ``$``, ``$(NAME)`` a defined variable's value (else left as
    written), a ``$`` before anything else itself."""
    out, checkpoint, cursor = [], 0, 0
    while cursor < len(value):
        if value[cursor] == "$" and cursor + 1 < len(value):
            out.append(value[checkpoint:cursor])
            rest = value[cursor + 1 :]
            if rest[0] == "$":
                read, advance = "$", 1
            elif rest[0] == "(" and ")" in rest:
                name = rest[1 : rest.index(")")]
                read, advance = defined.get(name, f"$({name})"), rest.index(")") + 1
            else:
                read, advance = "$" + rest[0] if rest[0] != "(" else "$(", 1
            out.append(read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + value[checkpoint:]


@pytest.mark.parametrize("value", ["a$(HOME)b", "$$", "x$", "$(", "50$ off", "$(OMNI_CACHE_DIR)/x", "plain"])
def test_a_value_reaches_the_process_as_written_as_under_omni_up(value: str) -> None:
    """`omni up` passes a value as it is; on a cluster the kubelet expands it, so the renderer
    escapes every $ and the kubelet's expansion gives the written value back."""
    pods = _pods(_example("tiny-cpu.yaml", {"MY_VALUE": value}))
    for name, pod in pods.items():
        env = _env(pod)
        rendered = {e["name"]: e["value"] for e in env if "value" in e}  # not valueFrom
        defined = {name: _kubelet_expand(text, {}) for name, text in rendered.items()}
        if "MY_VALUE" in rendered:
            assert _kubelet_expand(rendered["MY_VALUE"], defined) == value, name
    assert _kubelet_expand("a$(HOME)b", {"HOME": "/tmp"}) == "a/tmpb"  # what it would have been
