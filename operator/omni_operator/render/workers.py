"""Builders for one worker's objects: its stage pods, its headless Service, its NetworkPolicy
(who may connect to the stage pods, and where they may connect: see `worker_network_policy`).

Stage pods are bare Pods owned by the OmniDeployment: the operator replaces a worker whole and
drains it first, which a Deployment or StatefulSet would not let it do.
"""

from __future__ import annotations

import ipaddress

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
    peer_cache_env,
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
    if plan.runtime_version is not None:
        env |= peer_cache_env()
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


# Addresses stage pods never reach over the internet rule: RFC 1918, shared (CGNAT), loopback,
# link-local (the cloud metadata address), "this network", multicast and reserved space; for IPv6
# unique-local, link-local, multicast and IPv4-mapped addresses. The cluster's own pods and
# Services lie in these ranges (or in spec.media.deniedNetworks), so the internet rule does not
# reach them; the rules above it name what a worker does reach inside the cluster.
PRIVATE_V4 = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
)
# No ::ffff:0:0/96 here: the API server refuses an IPv4-mapped except ("must not have an IPv4-mapped
# IPv6 address"), and a connection to a mapped address leaves as IPv4, where the IPv4 rule applies.
PRIVATE_V6 = ("fc00::/7", "fe80::/10", "ff00::/8")


def kube_dns() -> Manifest:
    """The cluster DNS pods (a fresh object each time: rendered manifests share no nested objects)."""
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
    }


WEB_PORTS = (80, 443)  # media URLs (http, https) and model hubs


def worker_network_policy(plan: Plan, worker: WorkerPlan, *, owner: Owner | None = None) -> Manifest:
    """Stage pods take traffic only from their own worker and from the router, and open connections
    only to DNS, their own worker's pods and the internet's web ports.

    Egress, rule by rule: DNS to kube-dns (53, UDP and TCP); any port to the worker's own pods
    (stage links, the tensor-parallel rendezvous and NCCL between a thinker's nodes; the worker's
    headless Service resolves to these pods); TCP 80 and 443 to every address outside the private
    ranges and spec.media.deniedNetworks (media URLs, model hubs). Router and worker talk only over
    connections the router opens, which the ingress rule admits and whose replies need no egress
    rule; a worker opens no connection to the router, to other workers or to the API server.
    """
    selector = worker_selector(plan, worker.name)
    denied = [ipaddress.ip_network(cidr) for cidr in plan.denied_networks]
    except_v4 = [*PRIVATE_V4, *(str(n) for n in denied if n.version == 4)]
    except_v6 = [*PRIVATE_V6, *(str(n) for n in denied if n.version == 6)]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(worker.name, plan, labels_=worker_labels(plan, worker), owner=owner),
        "spec": {
            "podSelector": {"matchLabels": selector},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [
                        {"podSelector": {"matchLabels": selector}},
                        {"podSelector": {"matchLabels": router_selector(plan)}},
                    ]
                }
            ],
            "egress": [
                {
                    "to": [kube_dns()],
                    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
                },
                {"to": [{"podSelector": {"matchLabels": selector}}]},
                {
                    "to": [
                        {"ipBlock": {"cidr": "0.0.0.0/0", "except": except_v4}},
                        {"ipBlock": {"cidr": "::/0", "except": except_v6}},
                    ],
                    "ports": [{"protocol": "TCP", "port": port} for port in WEB_PORTS],
                },
            ],
        },
    }
