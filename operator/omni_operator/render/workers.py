"""Builders for one worker's objects: its stage pods, its headless Service, its NetworkPolicy.

Stage pods are bare Pods owned by the OmniDeployment: the operator replaces a worker whole and
drains it first, which a Deployment or StatefulSet would not let it do.
"""

from __future__ import annotations

from omni_operator.api import labels
from omni_operator.plan.types import Plan, StagePod, WorkerPlan
from omni_operator.render.common import (
    CACHE_DIR,
    TMP_DIR,
    Manifest,
    Owner,
    common_labels,
    container_ports,
    container_security_context,
    cpu_thread_env,
    env_list,
    metadata,
    pod_security_context,
    probes,
    resources,
    router_selector,
    worker_selector,
)
from omni_operator.render.config import CONFIG_MOUNT, config_map_name


def worker_labels(plan: Plan, worker: WorkerPlan) -> dict[str, str]:
    return {**common_labels(plan, "worker"), labels.WORKER: worker.name, labels.REVISION: worker.revision}


def stage_pod(plan: Plan, worker: WorkerPlan, pod: StagePod, *, owner: Owner | None = None) -> Manifest:
    container = pod.container
    pod_labels = {**worker_labels(plan, worker), labels.ROLE: pod.role.value}
    if pod.nnodes > 1:
        pod_labels[labels.RANK] = str(pod.node_rank)
    annotations = {labels.STAGES: ",".join(s.value for s in pod.stages), labels.POD_REVISION: pod.revision}
    main_port = next(iter(container.ports))
    mounts: list[Manifest] = [
        {"name": "tmp", "mountPath": TMP_DIR},
        {"name": "cache", "mountPath": CACHE_DIR},
    ]
    volumes: list[Manifest] = [{"name": "tmp", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}]
    model_volume = _model_volume(plan)
    if model_volume is not None:
        volume, mount = model_volume
        volumes.append(volume)
        mounts.append(mount)
    if container.gpus:
        # NCCL and CUDA IPC need more shared memory than the runtime's 64 MiB default.
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    if plan.config_files:
        volumes.append({"name": "config", "configMap": {"name": config_map_name(plan)}})
        mounts.append({"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True})
    env = {
        **container.env,
        **cpu_thread_env(container),
        "OMNI_CACHE_DIR": CACHE_DIR,
        "HF_HOME": f"{CACHE_DIR}/hf",
        "HOME": TMP_DIR,
    }
    spec: Manifest = {
        "hostname": pod.hostname,
        "subdomain": worker.name,
        "restartPolicy": "Always",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security_context(),
        "affinity": {
            "podAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": worker_selector(plan, worker.name)},
                            "topologyKey": plan.scheduling.topology_key,
                        },
                    }
                ]
            }
        },
        "containers": [
            {
                "name": pod.role.value,
                "image": container.image,
                "imagePullPolicy": plan.image_pull_policy,
                "command": list(container.command),
                "env": env_list(env),
                "ports": container_ports(container),
                "resources": resources(container, plan.scheduling.gpu_resource_name),
                **probes(container, main_port),
                "securityContext": container_security_context(),
                "volumeMounts": mounts,
            }
        ],
        "volumes": volumes,
    }
    if container.gpus:
        if plan.scheduling.node_selector:
            spec["nodeSelector"] = dict(plan.scheduling.node_selector)
        if plan.scheduling.tolerations:
            spec["tolerations"] = [dict(t) for t in plan.scheduling.tolerations]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata(pod.name, plan, labels_=pod_labels, owner=owner, annotations=annotations),
        "spec": spec,
    }


def _model_volume(plan: Plan) -> tuple[Manifest, Manifest] | None:
    source = plan.model_volume
    if source is None or source.source not in ("pvc", "hostPath"):
        return None  # image: baked in; tiny: written into the cache dir
    mount: Manifest = {"name": "model", "mountPath": source.mount_path, "readOnly": True}
    if source.source == "pvc":
        if source.sub_path:
            mount["subPath"] = source.sub_path
        return {
            "name": "model",
            "persistentVolumeClaim": {"claimName": source.claim_name, "readOnly": True},
        }, mount
    return {"name": "model", "hostPath": {"path": source.host_path, "type": "Directory"}}, mount


def worker_service(plan: Plan, worker: WorkerPlan, *, owner: Owner | None = None) -> Manifest:
    """Headless Service named after the worker: stable DNS for every stage pod, ready or not
    (stage links must connect while the worker is still warming up)."""
    ports: dict[str, int] = {}
    for pod in worker.pods:
        ports.update(pod.container.ports)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        # The router reads the worker's API URL here (layouts differ in which pod serves it).
        "metadata": metadata(
            worker.name,
            plan,
            labels_=worker_labels(plan, worker),
            owner=owner,
            annotations={labels.API_URL: worker.api_url},
        ),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": worker_selector(plan, worker.name),
            "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in ports.items()],
        },
    }


def worker_network_policy(plan: Plan, worker: WorkerPlan, *, owner: Owner | None = None) -> Manifest:
    """Stage pods take traffic only from their own worker and from the router."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(worker.name, plan, labels_=worker_labels(plan, worker), owner=owner),
        "spec": {
            "podSelector": {"matchLabels": worker_selector(plan, worker.name)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        {"podSelector": {"matchLabels": worker_selector(plan, worker.name)}},
                        {"podSelector": {"matchLabels": router_selector(plan)}},
                    ]
                }
            ],
        },
    }
