"""Builders for the router: its Deployment, the endpoint Service, RBAC and disruption budget.

The router finds workers itself (`--source kubernetes`): it watches the worker Services and pods
of its deployment, so it gets a ServiceAccount with read access to exactly those kinds, plus
`patch` on Services: each router replica writes its live-session report on a draining worker's
Service (`live-sessions.omni.dev/<pod name>`), which lets the operator end the drain early. The
pod name reaches the router as $POD_NAME through the downward API.
"""

from __future__ import annotations

from omni_operator.api import labels
from omni_operator.plan.types import Plan
from omni_operator.render.common import (
    TMP_DIR,
    Manifest,
    Owner,
    common_labels,
    container_ports,
    container_security_context,
    env_list,
    metadata,
    pod_security_context,
    probes,
    resources,
    router_selector,
)

AUTH_MOUNT = "/etc/omni/auth"  # the planner's AUTH_DIR: --api-keys-file points under it


def router_name(plan: Plan) -> str:
    return f"{plan.deployment}-router"


def router_labels(plan: Plan) -> dict[str, str]:
    return {**common_labels(plan, "router"), labels.ROLE: "router"}


def router_deployment(plan: Plan, *, owner: Owner | None = None) -> Manifest:
    router, container = plan.router, plan.router.container
    mounts: list[Manifest] = [{"name": "tmp", "mountPath": TMP_DIR}]
    volumes: list[Manifest] = [{"name": "tmp", "emptyDir": {}}]
    if router.auth_secret:
        volumes.append({"name": "auth", "secret": {"secretName": router.auth_secret}})
        mounts.append({"name": "auth", "mountPath": AUTH_MOUNT, "readOnly": True})
    main_port = next(iter(container.ports))
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(plan.deployment, plan, labels_=router_labels(plan), owner=owner),
        "spec": {
            "replicas": router.replicas,
            "selector": {"matchLabels": router_selector(plan)},
            "template": {
                "metadata": {"labels": router_labels(plan)},
                "spec": {
                    "serviceAccountName": router_name(plan),
                    "automountServiceAccountToken": True,  # it reads worker Services and pods
                    "enableServiceLinks": False,
                    "securityContext": pod_security_context(),
                    "containers": [
                        {
                            "name": "router",
                            "image": container.image,
                            "imagePullPolicy": plan.image_pull_policy,
                            "command": list(container.command),
                            "env": [
                                *env_list({**container.env, "HOME": TMP_DIR}),
                                # The key of this replica's session reports on draining workers.
                                {
                                    "name": "POD_NAME",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                                },
                            ],
                            "ports": container_ports(container),
                            "resources": resources(container, plan.scheduling.gpu_resource_name),
                            **probes(container, main_port),
                            "securityContext": container_security_context(),
                            "volumeMounts": mounts,
                        }
                    ],
                    "volumes": volumes,
                },
            },
        },
    }


def router_service(plan: Plan, *, owner: Owner | None = None) -> Manifest:
    """The deployment's endpoint: clients talk to `{deployment}` and never to a worker."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(plan.deployment, plan, labels_=router_labels(plan), owner=owner),
        "spec": {
            "type": plan.router.service_type,
            "selector": router_selector(plan),
            "ports": [{"name": "http", "port": plan.router.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def router_service_account(plan: Plan, *, owner: Owner | None = None) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(router_name(plan), plan, labels_=router_labels(plan), owner=owner),
        "automountServiceAccountToken": False,  # only the router pod opts in
    }


def router_role(plan: Plan, *, owner: Owner | None = None) -> Manifest:
    read = ["get", "list", "watch"]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(router_name(plan), plan, labels_=router_labels(plan), owner=owner),
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": read},
            # patch: the router's session reports on draining workers (annotations only).
            {"apiGroups": [""], "resources": ["services"], "verbs": [*read, "patch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read},
        ],
    }


def router_role_binding(plan: Plan, *, owner: Owner | None = None) -> Manifest:
    name = router_name(plan)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(name, plan, labels_=router_labels(plan), owner=owner),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": plan.namespace}],
    }


def router_pdb(plan: Plan, *, owner: Owner | None = None) -> Manifest:
    """At most one router pod down at a time for voluntary disruptions (node drains)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(router_name(plan), plan, labels_=router_labels(plan), owner=owner),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": router_selector(plan)}},
    }
