"""Plan -> every Kubernetes object of a deployment, in apply order.

Pure: the same Plan gives the same list. The operator applies these with server-side apply; `omni
render` prints them. Each kind has its own small builder (router.py, workers.py, config.py).
"""

from __future__ import annotations

from omni_operator.plan.types import Plan, Target
from omni_operator.render.common import Manifest, Owner
from omni_operator.render.config import config_map
from omni_operator.render.router import (
    router_deployment,
    router_pdb,
    router_role,
    router_role_binding,
    router_service,
    router_service_account,
)
from omni_operator.render.workers import stage_pod, worker_network_policy, worker_service


def render_manifests(plan: Plan, *, owner: Owner | tuple[str, str] | None = None) -> list[Manifest]:
    """Shared objects first (RBAC, config, router), then each worker's Service, policy and pods."""
    if plan.target is not Target.kubernetes:
        raise ValueError(f"plan targets {plan.target.value}; render needs a plan made with target kubernetes")
    own = Owner(*owner) if owner is not None else None
    out: list[Manifest] = [
        router_service_account(plan, owner=own),
        router_role(plan, owner=own),
        router_role_binding(plan, owner=own),
        config_map(plan, owner=own),
        router_service(plan, owner=own),
        router_deployment(plan, owner=own),
        router_pdb(plan, owner=own),
    ]
    for worker in plan.workers:
        out.append(worker_service(plan, worker, owner=own))
        out.append(worker_network_policy(plan, worker, owner=own))
        out.extend(stage_pod(plan, worker, pod, owner=own) for pod in worker.pods)
    return out


def render_worker(plan: Plan, index: int, *, owner: Owner | tuple[str, str] | None = None) -> list[Manifest]:
    """One worker's objects only: what the operator creates when it surges or replaces a worker."""
    own = Owner(*owner) if owner is not None else None
    worker = next(w for w in plan.workers if w.index == index)
    return [
        worker_service(plan, worker, owner=own),
        worker_network_policy(plan, worker, owner=own),
        *(stage_pod(plan, worker, pod, owner=own) for pod in worker.pods),
    ]
