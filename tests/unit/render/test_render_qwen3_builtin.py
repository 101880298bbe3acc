"""Rendered manifests of the builtin runtime's Qwen3-Omni-MoE examples, exactly where they differ.

tiny-qwen3-cpu.yaml: one worker pod whose command names the tiny family (the runtime writes the
tiny Qwen3-Omni-MoE checkpoint into its cache volume). qwen3-omni-builtin-h200.yaml: the split
layout of the Qwen2.5 example (api pod on CPU, thinker GPU, talker GPU) with a PVC checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from omni_operator.api.load import load_deployments
from omni_operator.plan import plan_deployment
from omni_operator.plan.types import Plan
from omni_operator.render import render_manifests

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
CACHE_ENV = [
    {"name": "OMNI_CACHE_DIR", "value": "/var/cache/omni"},
    {"name": "HF_HOME", "value": "/var/cache/omni/hf"},
    {"name": "HOME", "value": "/tmp"},
]
SCRATCH = [{"name": "tmp", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}]
SCRATCH_MOUNTS = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "cache", "mountPath": "/var/cache/omni"}]


def _objects(name: str) -> tuple[Plan, dict[tuple[str, str], dict]]:
    (dep,) = load_deployments(EXAMPLES / name)
    plan = plan_deployment(dep)
    return plan, {(m["kind"], m["metadata"]["name"]): m for m in render_manifests(plan)}


def test_tiny_qwen3_worker_writes_the_qwen3_tiny_checkpoint_into_its_cache() -> None:
    plan, objs = _objects("tiny-qwen3-cpu.yaml")
    assert [key for key in objs if key[0] in ("Pod", "Service")] == [
        ("Service", "tiny-qwen3"),
        ("Service", "tiny-qwen3-w0"),
        ("Pod", "tiny-qwen3-w0-worker"),
    ]
    pod = objs[("Pod", "tiny-qwen3-w0-worker")]
    (container,) = pod["spec"]["containers"]
    assert container["command"] == [
        "omni", "serve", "--tiny-family", "qwen3_omni_moe", "--model-name", "tiny-qwen3-omni",
        "--pipeline", "streaming-speech", "--port", "8000", "--device", "cpu",
        "--worker-id", "tiny-qwen3-w0", "--revision", plan.revision,
    ]  # fmt: skip
    assert container["env"] == [{"name": "OMP_NUM_THREADS", "value": "1"}, *CACHE_ENV]
    assert container["volumeMounts"] == SCRATCH_MOUNTS
    assert pod["spec"]["volumes"] == SCRATCH  # no model volume: the checkpoint is written, not mounted
    assert pod["metadata"]["annotations"]["omni.dev/stages"] == (
        "preprocessing,audio_encoder,image_encoder,mm_aggregate,thinker,decode,talker,segmenter,talker_stream"
    )


def test_qwen3_builtin_h200_places_the_thinker_and_the_talker_on_their_own_gpus() -> None:
    _, objs = _objects("qwen3-omni-builtin-h200.yaml")
    pods = {name: m for (kind, name), m in objs.items() if kind == "Pod"}
    assert list(pods) == [f"qwen3-omni-builtin-w0-{role}" for role in ("api", "thinker", "talker")]
    api, thinker, talker = (pods[f"qwen3-omni-builtin-w0-{r}"]["spec"] for r in ("api", "thinker", "talker"))
    model = {
        "name": "model",
        "persistentVolumeClaim": {"claimName": "qwen3-omni-30b-a3b-instruct", "readOnly": True},
    }
    mount = {"name": "model", "mountPath": "/models/Qwen3-Omni-30B-A3B-Instruct", "readOnly": True}
    shm = {"name": "shm", "emptyDir": {"medium": "Memory"}}
    assert api["volumes"] == [*SCRATCH, model]
    assert thinker["volumes"] == talker["volumes"] == [*SCRATCH, model, shm]
    assert api["containers"][0]["volumeMounts"] == [*SCRATCH_MOUNTS, mount]
    assert thinker["containers"][0]["volumeMounts"] == [
        *SCRATCH_MOUNTS,
        mount,
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    assert [p["containers"][0]["resources"] for p in (api, thinker, talker)] == [
        {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
        {
            "requests": {"cpu": "8", "memory": "96Gi", "nvidia.com/gpu": "1"},
            "limits": {"cpu": "8", "memory": "96Gi", "nvidia.com/gpu": "1"},
        },
        {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}},
    ]
    toleration = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "tolerations" not in api and thinker["tolerations"] == talker["tolerations"] == toleration
    assert [c["env"] for c in (api["containers"][0], thinker["containers"][0])] == [
        [{"name": "OMP_NUM_THREADS", "value": "2"}, *CACHE_ENV],
        CACHE_ENV,
    ]
    service = objs[("Service", "qwen3-omni-builtin-w0")]
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [
        ("http", 8000),
        ("thinker", 9100),
        ("talker", 9101),
    ]
    assert service["metadata"]["annotations"] == {
        "omni.dev/api-url": "http://api.qwen3-omni-builtin-w0.default.svc.cluster.local:8000"
    }
