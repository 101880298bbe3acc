"""Simulated nodes for the test control plane: GPU capacity, tier label, the kwok annotation.

Plain data (no cluster needed): e2e_cluster.register_nodes creates them and waits for kwok to mark
them Ready.
"""

from __future__ import annotations

from dataclasses import dataclass

KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TIER_LABEL = "omni.dev/gpu-tier"


@dataclass(frozen=True)
class NodeShape:
    """A simulated node: kwok keeps it Ready and runs the pods bound to it."""

    name: str
    gpus: int = 8
    gpu_tier: str | None = "h100"
    cpu: str = "96"
    memory: str = "1536Gi"
    pods: int = 110


def gpu_nodes(count: int = 4, *, gpus: int = 8, tier: str = "h100") -> list[NodeShape]:
    return [NodeShape(name=f"kwok-gpu-{i}", gpus=gpus, gpu_tier=tier) for i in range(count)]


def node_manifest(node: NodeShape) -> dict:
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    capacity = {"cpu": node.cpu, "memory": node.memory, "pods": str(node.pods)}
    if node.gpus:
        capacity[GPU_RESOURCE] = str(node.gpus)
    if node.gpu_tier:
        labels[GPU_TIER_LABEL] = node.gpu_tier
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": labels,
            # kwok manages nodes carrying this annotation. No kwok taint: this cluster has no real
            # nodes that real pods could land on, and the operator's pods should not need a toleration.
            "annotations": {
                KWOK_NODE_ANNOTATION[0]: KWOK_NODE_ANNOTATION[1],
                "node.alpha.kubernetes.io/ttl": "0",
            },
        },
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }
