"""spec -> Plan: the one entry point of the planner.

`plan_deployment` is pure: the same OmniDeployment and options always give the same Plan. The
rules (rules.py) decide what is allowed, the catalogue (catalogue.py) what a model needs, the
adapters (adapters.py) how each runtime spells it, layout.py lays out each worker's pods.
"""

from __future__ import annotations

import ipaddress
from pathlib import PurePosixPath

from omni_operator.api.spec import GpuTier, OmniDeployment, RuntimeSpec, RuntimeType, SourceType
from omni_operator.plan import adapters, rules
from omni_operator.plan.catalogue import (
    ARCHITECTURES,
    default_mem_fraction,
    resolve_architecture,
    runtime_version,
    tier_memory_gb,
)
from omni_operator.plan.graph import pipeline_edges, pipeline_stages
from omni_operator.plan.layout import K8S_PORTS, WorkerLayout
from omni_operator.plan.revisions import pod_revision, worker_revision
from omni_operator.plan.types import Container, ModelVolume, Plan, Role, RouterPlan, Scheduling, Target

__all__ = ["plan_deployment", "pod_revision", "worker_revision"]

CONFIG_DIR = "/etc/omni"  # where the deployment's ConfigMap is mounted in pods
AUTH_DIR = "/etc/omni/auth"  # where the router's API-key Secret is mounted
DEFAULT_RUNTIME_IMAGE: str = RuntimeSpec.model_fields["image"].default


def plan_deployment(
    dep: OmniDeployment,
    *,
    target: Target = Target.kubernetes,
    base_port: int = 8100,
    router_port: int = 8000,
    gpu_offset: int = 0,
    workers_file: str | None = None,
) -> Plan:
    """The placement plan of one OmniDeployment; raises PlanError naming the field and the fix."""
    spec, name = dep.spec, dep.metadata.name
    architecture = resolve_architecture(spec.model)
    rules.check_spec(spec, architecture)
    allocation = rules.allocate_gpus(spec)
    if target is Target.kubernetes:
        rules.check_nodes(spec, allocation)
    else:
        rules.check_local(spec)
    memory_gb = tier_memory_gb(spec.gpu.tier, spec.gpu.memory_gb)
    mem_fraction = spec.stages.thinker.mem_fraction_static or default_mem_fraction(spec.gpu.tier)
    params = spec.model.thinker_params_billions
    if params is None and architecture in ARCHITECTURES:
        params = ARCHITECTURES[architecture].thinker_params_billions
    # Unknown family without a declared size, the tiny checkpoint and CPU runs skip the fit check.
    if (
        params is not None
        and spec.gpu.tier is not GpuTier.cpu
        and spec.model.source.type is not SourceType.tiny
    ):
        rules.check_fit(
            spec,
            architecture=architecture,
            params_billions=params,
            memory_gb=memory_gb,
            mem_fraction=mem_fraction,
        )
    talker = rules.talker_enabled(spec)
    stages = pipeline_stages(spec, talker=talker)
    workers_file = workers_file or f".omni/{name}/workers.json"
    layout = WorkerLayout(
        dep=dep,
        architecture=architecture,
        allocation=allocation,
        target=target,
        base_port=base_port,
        gpu_offset=gpu_offset,
        mem_fraction=mem_fraction,
        stages=stages,
        revision=worker_revision(spec),
        nnodes=rules.thinker_nodes(spec) if target is Target.kubernetes else 1,
        config_dir=CONFIG_DIR if target is Target.kubernetes else str(PurePosixPath(workers_file).parent),
    )
    config_files: dict[str, str] = {}
    if spec.runtime.type is RuntimeType.vllm_omni:
        config_files[adapters.VLLM_DEPLOY_CONFIG] = adapters.vllm_deploy_config(
            spec,
            version=runtime_version(spec.runtime.type, spec.runtime.version) or "",
            deployment=name,
            architecture=architecture,
            thinker=allocation.thinker,
            talker=allocation.talker,
            mem_fraction=mem_fraction,
        )
    return Plan(
        deployment=name,
        namespace=dep.metadata.namespace,
        target=target,
        model_name=spec.model.name,
        architecture=architecture.value,
        runtime=spec.runtime.type.value,
        runtime_version=runtime_version(spec.runtime.type, spec.runtime.version),
        pipeline=spec.pipeline.value,
        stages=stages,
        edges=pipeline_edges(stages),
        gpu_tier=spec.gpu.tier.value,
        gpu_memory_gb=memory_gb,
        mem_fraction_static=mem_fraction,
        gpus_per_worker=allocation.total,
        revision=layout.revision,
        workers=tuple(layout.worker(i) for i in range(spec.workers)),
        router=_router(dep, target=target, router_port=router_port, workers_file=workers_file),
        config_files=config_files,
        scheduling=Scheduling(
            gpu_resource_name=spec.gpu.resource_name,
            node_selector=dict(spec.gpu.node_selector),
            tolerations=tuple(t.model_dump(by_alias=True, exclude_none=True) for t in spec.gpu.tolerations),
            topology_key=spec.gpu.topology_key,
        ),
        model_volume=ModelVolume(
            source=spec.model.source.type.value,
            mount_path=spec.model.path,
            claim_name=spec.model.source.claim_name,
            sub_path=spec.model.source.sub_path,
            host_path=spec.model.source.host_path,
        ),
        denied_networks=tuple(str(ipaddress.ip_network(n, strict=False)) for n in spec.media.denied_networks),
        image_pull_policy=spec.runtime.image_pull_policy,
    )


def _router(dep: OmniDeployment, *, target: Target, router_port: int, workers_file: str) -> RouterPlan:
    spec, name = dep.spec, dep.metadata.name
    router = spec.router
    limits = [
        "--session-header",
        router.session_header,
        "--max-sessions-per-worker",
        str(router.limits.max_sessions_per_worker),
        "--max-body-bytes",
        str(router.limits.max_request_body_bytes),
        "--upstream-timeout",
        str(router.limits.request_timeout_seconds),
    ]
    if target is Target.local:
        port = router_port
        # Local workers listen on loopback only; the router does the same.
        command = [
            "omni",
            "router",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers-file",
            workers_file,
            *limits,
        ]
        service_port = router_port
    else:
        port = K8S_PORTS[Role.api]
        # `omni router` listens on loopback unless told otherwise; a pod listens on its own IP.
        command = ["omni", "router", "--host", "0.0.0.0", "--port", str(port), "--source", "kubernetes"]
        command += ["--namespace", dep.metadata.namespace, "--deployment", name, *limits]
        if router.auth is not None:
            command += ["--api-keys-file", f"{AUTH_DIR}/{router.auth.key}"]
        service_port = router.port
    return RouterPlan(
        replicas=router.replicas,
        port=service_port,
        session_header=router.session_header,
        service_type=router.service_type.value,
        auth_secret=router.auth.secret_name if router.auth else None,
        auth_key=router.auth.key if router.auth else None,
        container=Container(
            image=adapters.router_image(spec, DEFAULT_RUNTIME_IMAGE),
            command=tuple(command),
            ports={"http": port},
            cpu=router.resources.cpu or "1",
            memory=router.resources.memory or "1Gi",
            readiness_path="/health",
            liveness_path="/health",
        ),
    )
