"""Pieces every rendered object shares: metadata, labels, security and probes.

One definition of the restricted security context and of the label sets, so selectors (Services,
NetworkPolicies, the router's watch) and the objects they select can never drift apart.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from omni_operator.api import labels
from omni_operator.api.spec import API_VERSION, KIND
from omni_operator.plan.types import Container, Plan

Manifest = dict[str, Any]  # one Kubernetes object as plain JSON-able data

TMP_DIR = "/tmp"
CACHE_DIR = "/var/cache/omni"  # writable cache (tiny checkpoint, HF files): an emptyDir
RUN_AS = 10001  # the runtime image's USER
STARTUP_PERIOD_S, STARTUP_FAILURES = 10, 180  # up to 30 minutes to load and warm a model


class Owner(NamedTuple):
    """The OmniDeployment that owns the rendered objects (garbage collection follows it)."""

    name: str
    uid: str


def metadata(
    name: str,
    plan: Plan,
    *,
    labels_: dict[str, str],
    owner: Owner | None,
    annotations: dict[str, str] | None = None,
) -> Manifest:
    meta: Manifest = {"name": name, "namespace": plan.namespace, "labels": labels_}
    if annotations:
        meta["annotations"] = annotations
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": owner.name,
                "uid": owner.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return meta


def common_labels(plan: Plan, component: str) -> dict[str, str]:
    return {
        labels.DEPLOYMENT: plan.deployment,
        labels.COMPONENT: component,
        labels.APP_NAME: labels.APP_NAME_VALUE,
        labels.APP_INSTANCE: plan.deployment,
        labels.APP_COMPONENT: component,
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
    }


def worker_selector(plan: Plan, worker: str) -> dict[str, str]:
    return {labels.DEPLOYMENT: plan.deployment, labels.WORKER: worker}


def router_selector(plan: Plan) -> dict[str, str]:
    return {labels.DEPLOYMENT: plan.deployment, labels.COMPONENT: "router"}


def pod_security_context() -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _probe_action(path: str | None, port_name: str) -> Manifest:
    if path is None:
        return {"tcpSocket": {"port": port_name}}
    return {"httpGet": {"path": path, "port": port_name}}


def probes(container: Container, port_name: str) -> Manifest:
    """Readiness on the readiness path (or TCP); a long startup window before liveness counts
    (the container's own window where it sets one, else STARTUP_FAILURES periods)."""
    ready, alive = container.readiness_path, container.liveness_path
    failures = STARTUP_FAILURES
    if container.startup_s is not None:
        failures = math.ceil(container.startup_s / STARTUP_PERIOD_S)
    timeout = {"timeoutSeconds": container.probe_timeout_s} if container.probe_timeout_s else {}
    return {
        "readinessProbe": {
            **_probe_action(ready, port_name),
            "periodSeconds": 5,
            "failureThreshold": 3,
            **timeout,
        },
        "startupProbe": {
            **_probe_action(alive, port_name),
            "periodSeconds": STARTUP_PERIOD_S,
            "failureThreshold": failures,
            **timeout,
        },
        "livenessProbe": {
            **_probe_action(alive, port_name),
            "periodSeconds": 10,
            "failureThreshold": 6,
            **timeout,
        },
    }


def resources(container: Container, gpu_resource: str) -> Manifest:
    """Requests equal limits: GPUs must, and equal CPU/memory keeps latency predictable."""
    amounts: dict[str, str] = {}
    if container.cpu:
        amounts["cpu"] = container.cpu
    if container.memory:
        amounts["memory"] = container.memory
    if container.gpus:
        amounts[gpu_resource] = str(container.gpus)
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def cpu_thread_env(container: Container) -> dict[str, str]:
    """OMP_NUM_THREADS for a container without GPUs: its CPU limit, rounded up. torch and the math
    libraries otherwise size their thread pools by the node's cores, not the pod's limit, and the
    extra threads only get the container throttled. GPU containers are left to the runtime, which
    gives torch one thread there (omni_runtime.support.cpu_threads); an env the spec sets wins."""
    if container.gpus or not container.cpu or "OMP_NUM_THREADS" in container.env:
        return {}
    quantity = container.cpu.strip()
    try:
        cores = float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)
    except ValueError:  # a quantity form this does not read (e.g. "2k"): leave the pools alone
        return {}
    if not math.isfinite(cores):  # the spec refuses these (QUANTITY_PATTERN); never crash on one
        return {}
    return {"OMP_NUM_THREADS": str(max(1, math.ceil(cores)))}


def peer_cache_env() -> dict[str, str]:
    """Where sglang-omni and vllm-omni write, under a read-only root filesystem: every cache in the
    cache emptyDir (kept across container restarts, so a restart reuses compiled kernels). HOME
    (/tmp) already covers ~/.cache (sglang-omni's uploaded speakers, FlashInfer); XDG_CACHE_HOME
    moves vLLM's cache root (torch.compile artifacts) there too; Triton and TorchInductor get their
    own (Inductor's default needs the user's name, which uid 10001 has none of); sglang-omni's IPC
    sockets go to /tmp/sglang_omni, HF downloads and trust_remote_code modules to HF_HOME."""
    return {
        "XDG_CACHE_HOME": f"{CACHE_DIR}/xdg",
        "TRITON_CACHE_DIR": f"{CACHE_DIR}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{CACHE_DIR}/inductor",
    }


def env_list(env: dict[str, str]) -> list[Manifest]:
    """A container's env, each value reaching the process as written. The kubelet expands
    ``$(NAME)`` in env values and reduces ``$$`` to ``$``, so every ``$`` is doubled: a value such as
    spec.runtime.env's ``a$(HOME)`` means the same on a cluster as under ``omni up``, which passes
    values as they are."""
    return [{"name": k, "value": v.replace("$", "$$")} for k, v in env.items()]


def container_ports(container: Container) -> list[Manifest]:
    return [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in container.ports.items()]
