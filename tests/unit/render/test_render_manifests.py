"""Rendered manifests: exact objects for the tiny example, real-schema validation for every example."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from omni_operator.api.load import load_deployments
from omni_operator.plan import Target, plan_deployment
from omni_operator.plan.types import Container
from omni_operator.render import Owner, render_manifests, render_worker
from omni_operator.render.common import cpu_thread_env

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples").glob("*.yaml"))
K8S_VERSION = kubernetes_validate.utils.latest_version()


def _plan(name: str, **kw):
    (dep,) = load_deployments(Path(__file__).resolve().parents[3] / "examples" / name)
    return plan_deployment(dep, **kw)


def _by_kind_name(manifests: list[dict]) -> dict[tuple[str, str], dict]:
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests}


def test_newest_kubernetes_schemas_are_used() -> None:
    major, minor = (int(x) for x in K8S_VERSION.split(".")[:2])
    assert (major, minor) >= (1, 33)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_manifest_validates_against_kubernetes(path: Path) -> None:
    (dep,) = load_deployments(path)
    manifests = render_manifests(plan_deployment(dep), owner=("owner", "1234-5678"))
    for manifest in manifests:
        # strict: unknown fields fail too, not only wrong types.
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    names = [(m["kind"], m["metadata"]["name"]) for m in manifests]
    assert len(names) == len(set(names))


def test_validator_rejects_a_broken_pod() -> None:
    pod = next(m for m in render_manifests(_plan("tiny-cpu.yaml")) if m["kind"] == "Pod")
    pod["spec"]["containers"][0]["ports"][0]["containerPort"] = "eight thousand"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_tiny_kinds_in_apply_order() -> None:
    kinds = [(m["kind"], m["metadata"]["name"]) for m in render_manifests(_plan("tiny-cpu.yaml"))]
    assert kinds == [
        ("ServiceAccount", "tiny-omni-router"),
        ("Role", "tiny-omni-router"),
        ("RoleBinding", "tiny-omni-router"),
        ("ConfigMap", "tiny-omni-config"),
        ("Service", "tiny-omni"),
        ("Deployment", "tiny-omni"),
        ("PodDisruptionBudget", "tiny-omni-router"),
        ("Service", "tiny-omni-w0"),
        ("NetworkPolicy", "tiny-omni-w0"),
        ("Pod", "tiny-omni-w0-worker"),
        ("Service", "tiny-omni-w1"),
        ("NetworkPolicy", "tiny-omni-w1"),
        ("Pod", "tiny-omni-w1-worker"),
    ]


def _labels(component: str, **extra: str) -> dict[str, str]:
    return {
        "omni.dev/deployment": "tiny-omni",
        "omni.dev/component": component,
        "app.kubernetes.io/name": "omni",
        "app.kubernetes.io/instance": "tiny-omni",
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "omni-operator",
        **extra,
    }


RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "fsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}
PRIVATE_V4 = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
]
PRIVATE_V6 = ["fc00::/7", "fe80::/10", "ff00::/8"]
OWNER_REFS = [
    {
        "apiVersion": "omni.dev/v1alpha1",
        "kind": "OmniDeployment",
        "name": "tiny-omni",
        "uid": "u-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
]


def test_tiny_worker_pod_exact() -> None:
    plan = _plan("tiny-cpu.yaml")
    worker = plan.workers[1]
    pod = worker.pods[0]
    got = _by_kind_name(render_manifests(plan, owner=Owner("tiny-omni", "u-1")))[
        ("Pod", "tiny-omni-w1-worker")
    ]
    assert got == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "tiny-omni-w1-worker",
            "namespace": "default",
            "labels": _labels(
                "worker",
                **{
                    "omni.dev/worker": "tiny-omni-w1",
                    "omni.dev/revision": plan.revision,
                    "omni.dev/role": "worker",
                },
            ),
            "annotations": {
                "omni.dev/stages": "preprocessing,audio_encoder,image_encoder,mm_aggregate,thinker,decode,talker",
                "omni.dev/pod-revision": pod.revision,
            },
            "ownerReferences": OWNER_REFS,
        },
        "spec": {
            "hostname": "worker",
            "subdomain": "tiny-omni-w1",
            "restartPolicy": "Always",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": POD_SECURITY,
            "affinity": {
                "podAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 100,
                            "podAffinityTerm": {
                                "labelSelector": {
                                    "matchLabels": {
                                        "omni.dev/deployment": "tiny-omni",
                                        "omni.dev/worker": "tiny-omni-w1",
                                    }
                                },
                                "topologyKey": "kubernetes.io/hostname",
                            },
                        }
                    ]
                }
            },
            "containers": [
                {
                    "name": "worker",
                    "image": "ghcr.io/omni-dev/omni-runtime:0.1.0-cpu",
                    "imagePullPolicy": "IfNotPresent",
                    "command": [
                        "omni",
                        "serve",
                        "--model-name",
                        "tiny-omni",
                        "--pipeline",
                        "speech",
                        "--port",
                        "8000",
                        "--device",
                        "cpu",
                        "--worker-id",
                        "tiny-omni-w1",
                        "--revision",
                        plan.revision,
                    ],
                    "env": [
                        {"name": "OMP_NUM_THREADS", "value": "1"},  # the CPU limit, not the node's cores
                        {"name": "OMNI_CACHE_DIR", "value": "/var/cache/omni"},
                        {"name": "HF_HOME", "value": "/var/cache/omni/hf"},
                        {"name": "HOME", "value": "/tmp"},
                    ],
                    "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                    "resources": {
                        "requests": {"cpu": "500m", "memory": "3Gi"},
                        "limits": {"cpu": "500m", "memory": "3Gi"},
                    },
                    "readinessProbe": {
                        "httpGet": {"path": "/ready", "port": "http"},
                        "periodSeconds": 5,
                        "failureThreshold": 3,
                    },
                    "startupProbe": {
                        "httpGet": {"path": "/health", "port": "http"},
                        "periodSeconds": 10,
                        "failureThreshold": 180,
                    },
                    "livenessProbe": {
                        "httpGet": {"path": "/health", "port": "http"},
                        "periodSeconds": 10,
                        "failureThreshold": 6,
                    },
                    "securityContext": RESTRICTED,
                    "volumeMounts": [
                        {"name": "tmp", "mountPath": "/tmp"},
                        {"name": "cache", "mountPath": "/var/cache/omni"},
                    ],
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}],
        },
    }


def test_tiny_services_policy_and_router_exact() -> None:
    plan = _plan("tiny-cpu.yaml")
    objs = _by_kind_name(render_manifests(plan))
    worker_labels = _labels(
        "worker", **{"omni.dev/worker": "tiny-omni-w0", "omni.dev/revision": plan.revision}
    )
    selector = {"omni.dev/deployment": "tiny-omni", "omni.dev/worker": "tiny-omni-w0"}
    router_selector = {"omni.dev/deployment": "tiny-omni", "omni.dev/component": "router"}
    assert objs[("Service", "tiny-omni-w0")] == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "tiny-omni-w0",
            "namespace": "default",
            "labels": worker_labels,
            "annotations": {"omni.dev/api-url": "http://worker.tiny-omni-w0.default.svc.cluster.local:8000"},
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector,
            "ports": [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    assert objs[("NetworkPolicy", "tiny-omni-w0")]["spec"] == {
        "podSelector": {"matchLabels": selector},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [
            {
                "from": [
                    {"podSelector": {"matchLabels": selector}},
                    {"podSelector": {"matchLabels": router_selector}},
                ]
            }
        ],
        "egress": [
            {
                "to": [
                    {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                    }
                ],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            },
            {"to": [{"podSelector": {"matchLabels": selector}}]},
            {
                "to": [
                    {"ipBlock": {"cidr": "0.0.0.0/0", "except": PRIVATE_V4}},
                    {"ipBlock": {"cidr": "::/0", "except": PRIVATE_V6}},
                ],
                "ports": [{"protocol": "TCP", "port": 80}, {"protocol": "TCP", "port": 443}],
            },
        ],
    }
    assert objs[("Service", "tiny-omni")]["spec"] == {
        "type": "ClusterIP",
        "selector": router_selector,
        "ports": [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}],
    }
    assert objs[("PodDisruptionBudget", "tiny-omni-router")]["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": router_selector},
    }
    router = objs[("Deployment", "tiny-omni")]
    assert router["spec"]["replicas"] == 1
    assert router["spec"]["selector"] == {"matchLabels": router_selector}
    template = router["spec"]["template"]
    assert template["metadata"]["labels"] == _labels("router", **{"omni.dev/role": "router"})
    assert template["spec"]["serviceAccountName"] == "tiny-omni-router"
    (container,) = template["spec"]["containers"]
    assert container["command"] == list(plan.router.container.command)
    assert container["securityContext"] == RESTRICTED
    assert container["env"] == [
        {"name": "HOME", "value": "/tmp"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    assert objs[("RoleBinding", "tiny-omni-router")]["subjects"] == [
        {"kind": "ServiceAccount", "name": "tiny-omni-router", "namespace": "default"}
    ]
    read = ["get", "list", "watch"]
    assert objs[("Role", "tiny-omni-router")]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": read},
        {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read},
    ]
    config = objs[("ConfigMap", "tiny-omni-config")]
    assert list(config["data"]) == ["plan.json"]
    assert yaml.safe_load(config["data"]["plan.json"])["deployment"] == "tiny-omni"


def test_owner_references_only_when_owned() -> None:
    plan = _plan("tiny-cpu.yaml")
    assert all("ownerReferences" not in m["metadata"] for m in render_manifests(plan))
    owned = render_manifests(plan, owner=("tiny-omni", "u-1"))
    assert all(m["metadata"]["ownerReferences"] == OWNER_REFS for m in owned)


def test_gpu_pods_request_gpus_and_schedule_on_gpu_nodes() -> None:
    plan = _plan("qwen2.5-omni-7b-h100.yaml")
    pods = {m["metadata"]["name"]: m for m in render_manifests(plan) if m["kind"] == "Pod"}
    api, thinker, talker = (pods[f"qwen25-omni-w0-{r}"] for r in ("api", "thinker", "talker"))
    assert thinker["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
    }
    assert talker["spec"]["containers"][0]["resources"] == {
        "requests": {"nvidia.com/gpu": "1"},
        "limits": {"nvidia.com/gpu": "1"},
    }
    toleration = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert thinker["spec"]["tolerations"] == toleration and talker["spec"]["tolerations"] == toleration
    assert "tolerations" not in api["spec"] and "nodeSelector" not in api["spec"]
    assert thinker["spec"]["volumes"][2:] == [
        {"name": "model", "hostPath": {"path": "/mnt/models/Qwen2.5-Omni-7B", "type": "Directory"}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    assert {"name": "model", "mountPath": "/models/Qwen2.5-Omni-7B", "readOnly": True} in api["spec"][
        "containers"
    ][0]["volumeMounts"]
    assert thinker["spec"]["containers"][0]["readinessProbe"]["tcpSocket"] == {"port": "thinker"}
    assert api["spec"]["containers"][0]["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    service = _by_kind_name(render_manifests(plan))[("Service", "qwen25-omni-w0")]
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [
        ("http", 8000),
        ("thinker", 9100),
        ("talker", 9101),
    ]
    assert service["metadata"]["annotations"] == {
        "omni.dev/api-url": "http://api.qwen25-omni-w0.default.svc.cluster.local:8000"
    }


def test_pvc_model_and_node_selector() -> None:
    plan = _plan("minicpm-o-duplex.yaml")
    pod = _by_kind_name(render_manifests(plan))[("Pod", "minicpm-duplex-w0-thinker")]
    assert {
        "name": "model",
        "persistentVolumeClaim": {"claimName": "minicpm-o-4-5", "readOnly": True},
    } in pod["spec"]["volumes"]
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L40S"}


def test_vllm_worker_mounts_its_deploy_config() -> None:
    plan = _plan("qwen3-omni-vllm.yaml")
    objs = _by_kind_name(render_manifests(plan))
    config = objs[("ConfigMap", "qwen3-omni-config")]
    assert sorted(config["data"]) == ["deploy_config.yaml", "plan.json"]
    assert config["data"]["deploy_config.yaml"] == plan.config_files["deploy_config.yaml"]
    pod = objs[("Pod", "qwen3-omni-w0-worker")]
    assert {"name": "config", "configMap": {"name": "qwen3-omni-config"}} in pod["spec"]["volumes"]
    assert {"name": "config", "mountPath": "/etc/omni", "readOnly": True} in pod["spec"]["containers"][0][
        "volumeMounts"
    ]
    assert pod["spec"]["containers"][0]["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert objs[("Deployment", "qwen3-omni")]["spec"]["replicas"] == 2


def test_multi_node_thinker_pods_carry_rank_labels() -> None:
    from omni_operator.api.spec import OmniDeployment

    dep = OmniDeployment.model_validate(
        {
            "metadata": {"name": "big"},
            "spec": {
                "model": {"name": "m", "thinkerParamsBillions": 400},
                "stages": {"thinker": {"tensorParallelSize": 16}},
            },
        }
    )
    manifests = render_manifests(plan_deployment(dep))
    for m in manifests:
        kubernetes_validate.validate(m, K8S_VERSION, strict=True)
    pods = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "Pod"}
    assert pods["big-w0-thinker"]["metadata"]["labels"]["omni.dev/node-rank"] == "0"
    assert pods["big-w0-thinker-1"]["metadata"]["labels"]["omni.dev/node-rank"] == "1"
    assert pods["big-w0-thinker-1"]["spec"]["hostname"] == "thinker-1"
    assert "omni.dev/node-rank" not in pods["big-w0-talker"]["metadata"]["labels"]
    env = {e["name"]: e["value"] for e in pods["big-w0-thinker-1"]["spec"]["containers"][0]["env"]}
    assert env["NODE_RANK"] == "1" and env["MASTER_ADDR"] == "thinker.big-w0.default.svc.cluster.local"


def test_router_auth_secret_is_mounted() -> None:
    from omni_operator.api.spec import OmniDeployment

    dep = OmniDeployment.model_validate(
        {
            "metadata": {"name": "auth"},
            "spec": {
                "model": {"name": "m"},
                "router": {"auth": {"secretName": "keys"}, "serviceType": "LoadBalancer"},
            },
        }
    )
    objs = _by_kind_name(render_manifests(plan_deployment(dep)))
    spec = objs[("Deployment", "auth")]["spec"]["template"]["spec"]
    assert {"name": "auth", "secret": {"secretName": "keys"}} in spec["volumes"]
    assert {"name": "auth", "mountPath": "/etc/omni/auth", "readOnly": True} in spec["containers"][0][
        "volumeMounts"
    ]
    assert spec["containers"][0]["command"][-2:] == ["--api-keys-file", "/etc/omni/auth/api-keys"]
    assert objs[("Service", "auth")]["spec"]["type"] == "LoadBalancer"


def test_render_worker_is_one_workers_slice() -> None:
    plan = _plan("tiny-cpu.yaml")
    full = render_manifests(plan)
    assert render_worker(plan, 1) == full[-3:]


def test_local_plans_are_not_rendered() -> None:
    with pytest.raises(ValueError, match="render needs a plan made with target kubernetes"):
        render_manifests(_plan("tiny-cpu.yaml", target=Target.local))


@pytest.mark.parametrize(
    ("cpu", "gpus", "env", "expected"),
    [
        ("2", 0, {}, {"OMP_NUM_THREADS": "2"}),
        ("500m", 0, {}, {"OMP_NUM_THREADS": "1"}),
        ("2500m", 0, {}, {"OMP_NUM_THREADS": "3"}),
        ("1.5", 0, {}, {"OMP_NUM_THREADS": "2"}),
        ("8", 1, {}, {}),  # a GPU container: the runtime gives torch one thread itself
        (None, 0, {}, {}),  # no limit: nothing to size by
        ("4", 0, {"OMP_NUM_THREADS": "6"}, {}),  # the spec's env wins
        ("2k", 0, {}, {}),  # a form not read here: pools left alone
    ],
)
def test_cpu_thread_env(cpu, gpus, env, expected) -> None:
    container = Container(image="i", command=("omni",), cpu=cpu, gpus=gpus, env=env)
    assert cpu_thread_env(container) == expected


def _media_plan(**media: object):
    from omni_operator.api.spec import OmniDeployment

    spec = {"model": {"name": "m"}, "gpu": {"tier": "cpu"}, "media": media}
    return plan_deployment(OmniDeployment.model_validate({"metadata": {"name": "med"}, "spec": spec}))


def test_egress_keeps_the_denied_networks_out_of_the_internet_rule() -> None:
    plan = _media_plan(deniedNetworks=["34.118.224.0/20", "2600:1900:4000::1/44", "10.96.0.0/12"])
    manifests = render_manifests(plan)
    for manifest in manifests:
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    policy = _by_kind_name(manifests)[("NetworkPolicy", "med-w0")]
    internet = policy["spec"]["egress"][2]["to"]
    assert internet == [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": [*PRIVATE_V4, "34.118.224.0/20", "10.96.0.0/12"]}},
        {"ipBlock": {"cidr": "::/0", "except": [*PRIVATE_V6, "2600:1900:4000::/44"]}},
    ]


def test_media_settings_reach_the_serve_command() -> None:
    plan = _media_plan(
        allowedDomains=["media.example.com", "*.cdn.example.net"], deniedNetworks=["34.118.224.0/20"]
    )
    pod = _by_kind_name(render_manifests(plan))[("Pod", "med-w0-worker")]
    command = pod["spec"]["containers"][0]["command"]
    assert command[command.index("--allowed-media-domain") :][:6] == [
        "--allowed-media-domain",
        "media.example.com",
        "--allowed-media-domain",
        "*.cdn.example.net",
        "--deny-media-network",
        "34.118.224.0/20",
    ]


def test_every_example_gets_the_egress_policy() -> None:
    for path in EXAMPLES:
        (dep,) = load_deployments(path)
        plan = plan_deployment(dep)
        policies = [m for m in render_manifests(plan) if m["kind"] == "NetworkPolicy"]
        assert len(policies) == len(plan.workers), path.name
        for policy in policies:
            assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"], path.name
