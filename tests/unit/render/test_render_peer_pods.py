"""Peer-runtime worker pods (sglang-omni, vllm-omni): requests, probes and cache paths, exactly.

Resources and the startup window come from the catalogue's parameter counts (plan/catalogue.py,
peer_pod_size): CPU 4 + 4 per GPU; memory = bf16 checkpoint GB + CPU offload x TP + 16 + 8 per GPU;
startup 30 minutes + 6 s per checkpoint GB, probed every 10 s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from omni_operator.api.load import load_deployments
from omni_operator.api.spec import OmniDeployment
from omni_operator.plan import plan_deployment
from omni_operator.plan.types import Plan
from omni_operator.render import render_manifests

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _plan(name: str) -> Plan:
    (dep,) = load_deployments(EXAMPLES / name)
    return plan_deployment(dep)


def _worker_pod(plan: Plan) -> dict[str, Any]:
    return next(m for m in render_manifests(plan) if m["kind"] == "Pod")["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("example", "cpu", "memory", "gpus", "startup_failures"),
    [
        # Ming: (103.0 + 0.5) x 2 = 207 GB; 5 GPUs (TP4 + talker).
        ("ming-flash-omni-speech-h100.yaml", "24", "263Gi", "5", 305),
        ("ming-flash-omni-streaming-speech-h100.yaml", "24", "263Gi", "5", 305),
        ("ming-flash-omni-text-h100.yaml", "20", "255Gi", "4", 305),
        ("ming-flash-omni-vision-tp2-h200.yaml", "24", "263Gi", "5", 305),
        ("ming-flash-omni-vllm-h200.yaml", "16", "247Gi", "3", 305),
        # MiniCPM-o: (8.2 + 0.5) x 2 = 17.4 -> 18 GB; 2 GPUs.
        ("minicpm-o-duplex-sglang.yaml", "12", "50Gi", "2", 191),
        ("minicpm-o-duplex-vllm.yaml", "12", "50Gi", "2", 191),
        # Qwen2.5-Omni: (7.6 + 0.7) x 2 = 16.6 -> 17 GB; 2 GPUs.
        ("qwen2.5-omni-7b-vllm.yaml", "12", "49Gi", "2", 191),
        # Qwen3-Omni: (30.5 + 3.0) x 2 = 67 GB; TP2 + talker = 3 GPUs, or 1 + 1 for duplex.
        ("qwen3-omni-sglang.yaml", "16", "107Gi", "3", 221),
        ("qwen3-omni-vllm.yaml", "16", "107Gi", "3", 221),
        ("qwen3-omni-vllm-duplex.yaml", "12", "99Gi", "2", 221),
    ],
)
def test_peer_worker_pod_requests_and_probes(
    example: str, cpu: str, memory: str, gpus: str, startup_failures: int
) -> None:
    container = _worker_pod(_plan(example))
    amounts = {"cpu": cpu, "memory": memory, "nvidia.com/gpu": gpus}
    assert container["resources"] == {"requests": amounts, "limits": amounts}
    health = {"httpGet": {"path": "/health", "port": "http"}, "timeoutSeconds": 5}
    assert container["readinessProbe"] == {**health, "periodSeconds": 5, "failureThreshold": 3}
    assert container["startupProbe"] == {**health, "periodSeconds": 10, "failureThreshold": startup_failures}
    assert container["livenessProbe"] == {**health, "periodSeconds": 10, "failureThreshold": 6}


@pytest.mark.parametrize("example", ["qwen3-omni-vllm.yaml", "minicpm-o-duplex-sglang.yaml"])
def test_peer_worker_pod_writes_only_to_its_volumes(example: str) -> None:
    container = _worker_pod(_plan(example))
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {e["name"]: e["value"] for e in container["env"]} == {
        "OMNI_CACHE_DIR": "/var/cache/omni",
        "HF_HOME": "/var/cache/omni/hf",
        "HOME": "/tmp",
        "XDG_CACHE_HOME": "/var/cache/omni/xdg",
        "TRITON_CACHE_DIR": "/var/cache/omni/triton",
        "TORCHINDUCTOR_CACHE_DIR": "/var/cache/omni/inductor",
    }
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/tmp", "/var/cache/omni", "/dev/shm"}


def test_builtin_pods_get_no_peer_cache_env() -> None:
    container = _worker_pod(_plan("tiny-cpu.yaml"))
    assert "XDG_CACHE_HOME" not in {e["name"] for e in container["env"]}
    assert "timeoutSeconds" not in container["startupProbe"]


def _with(example: str, **thinker: Any) -> Plan:
    (dep,) = load_deployments(EXAMPLES / example)
    body = dep.model_dump(mode="json", by_alias=True, exclude_none=True)
    body["spec"]["stages"]["thinker"].update(thinker)
    return plan_deployment(OmniDeployment.model_validate(body))


@pytest.mark.parametrize(
    ("thinker", "cpu", "memory"),
    [
        ({"resources": {"memory": "400Gi"}}, "24", "400Gi"),
        ({"resources": {"cpu": "32"}}, "32", "263Gi"),
        ({"resources": {"cpu": "32", "memory": "300Gi"}}, "32", "300Gi"),
        # CPU offload stays in host RAM on every thinker rank: + 8 GB x TP4.
        ({"quantization": "fp8", "cpuOffloadGb": 8}, "24", "295Gi"),
    ],
)
def test_peer_resources_follow_the_spec(thinker: dict[str, Any], cpu: str, memory: str) -> None:
    container = _worker_pod(_with("ming-flash-omni-speech-h100.yaml", **thinker))
    assert (container["resources"]["requests"]["cpu"], container["resources"]["requests"]["memory"]) == (
        cpu,
        memory,
    )
