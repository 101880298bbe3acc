"""spec -> Plan: names, ports, addresses, pods and revisions of every worker.

`plan_deployment` is pure: the same OmniDeployment and options always give the same Plan. The
rules (rules.py) decide what is allowed, the catalogue (catalogue.py) what a model needs, the
adapters (adapters.py) how each runtime spells it; this module only lays the pieces out.

Layouts:
- builtin on tier cpu: one `worker` pod per worker running every stage (`omni serve --device cpu`).
- builtin on GPUs: `api` (CPU: preprocessing, decode, the OpenAI API), `thinker` (encoders that sit
  with it, mm_aggregate, the TP ranks; one pod per node when TP exceeds a node), `talker`, and
  `image-encoder` when vision is dedicated. The api pod reaches the others by --remote-stage.
- sglang-omni / vllm-omni: one `worker` pod holding all of the worker's GPUs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import PurePosixPath

from omni_operator.api.spec import (
    Architecture,
    GpuTier,
    OmniDeployment,
    OmniDeploymentSpec,
    RuntimeSpec,
    RuntimeType,
    SourceType,
)
from omni_operator.plan import adapters, rules
from omni_operator.plan.catalogue import (
    ARCHITECTURES,
    default_mem_fraction,
    resolve_architecture,
    tier_memory_gb,
)
from omni_operator.plan.graph import pipeline_edges, pipeline_stages
from omni_operator.plan.types import (
    Container,
    ModelVolume,
    Plan,
    Role,
    RouterPlan,
    Scheduling,
    Stage,
    StagePod,
    Target,
    WorkerPlan,
)

# Kubernetes: fixed ports inside each pod. Local: base_port + 10 * worker index + offset.
K8S_PORTS: dict[Role, int] = {
    Role.worker: 8000,
    Role.api: 8000,
    Role.thinker: 9100,
    Role.talker: 9101,
    Role.image_encoder: 9102,
}
LOCAL_OFFSETS: dict[Role, int] = {
    Role.worker: 1,
    Role.api: 1,
    Role.thinker: 2,
    Role.talker: 3,
    Role.image_encoder: 4,
}
K8S_DIST_PORT = 29500
LOCAL_DIST_OFFSET = 5
PORT_NAMES: dict[Role, str] = {
    Role.worker: "http",
    Role.api: "http",
    Role.thinker: "thinker",
    Role.talker: "talker",
    Role.image_encoder: "image-encoder",
}
CONFIG_DIR = "/etc/omni"  # where the deployment's ConfigMap is mounted in pods
AUTH_DIR = "/etc/omni/auth"  # where the router's API-key Secret is mounted
ROUTER_CPU, ROUTER_MEMORY = "1", "1Gi"
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
    layout = _Layout(
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
        config_files[adapters.VLLM_STAGE_CONFIG] = adapters.vllm_stage_config(
            spec,
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
        image_pull_policy=spec.runtime.image_pull_policy,
    )


def _digest(payload: object) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def worker_revision(spec: OmniDeploymentSpec) -> str:
    """Hash of everything that shapes a worker; workers count, router and rollout are left out."""
    return _digest(
        spec.model_dump(mode="json", by_alias=True, include={"model", "runtime", "pipeline", "stages", "gpu"})
    )


def pod_revision(pod: StagePod, *, worker: str, revision: str) -> str:
    """Hash of one pod's template, the same for that role in every worker of one revision.

    The worker name and the worker revision (passed as --revision) are masked, so a change that
    leaves this pod's template alone leaves its revision alone too.
    """

    def mask(text: str) -> str:
        return text.replace(revision, "{revision}").replace(worker, "{worker}")

    container = pod.container
    payload = {
        "role": pod.role.value,
        "stages": [s.value for s in pod.stages],
        "logical_gpus": list(pod.logical_gpus),
        "node_rank": pod.node_rank,
        "nnodes": pod.nnodes,
        "container": container.model_dump(mode="json")
        | {
            "command": [mask(a) for a in container.command],
            "env": {k: mask(v) for k, v in container.env.items()},
        },
    }
    return _digest(payload)


@dataclass(frozen=True)
class _Layout:
    dep: OmniDeployment
    architecture: Architecture
    allocation: rules.GpuAllocation
    target: Target
    base_port: int
    gpu_offset: int
    mem_fraction: float
    stages: tuple[Stage, ...]
    revision: str
    nnodes: int
    config_dir: str

    @property
    def spec(self) -> OmniDeploymentSpec:
        return self.dep.spec

    @property
    def local(self) -> bool:
        return self.target is Target.local

    def port(self, index: int, role: Role) -> int:
        if self.local:
            return self.base_port + 10 * index + LOCAL_OFFSETS[role]
        return K8S_PORTS[role]

    def address(self, worker: str, hostname: str, port: int) -> str:
        if self.local:
            return f"127.0.0.1:{port}"
        return f"{hostname}.{worker}.{self.dep.metadata.namespace}.svc.cluster.local:{port}"

    def gpu_env(self, index: int, logical: tuple[int, ...]) -> dict[str, str]:
        """Local mode pins host GPUs; in Kubernetes the device plugin does it."""
        if not self.local or not logical:
            return {}
        first = self.gpu_offset + index * self.allocation.total
        return {"CUDA_VISIBLE_DEVICES": adapters.gpu_list([first + g for g in logical])}

    def image(self, role: Role) -> str:
        stages, runtime = self.spec.stages, self.spec.runtime
        override = {Role.thinker: stages.thinker.image, Role.talker: stages.talker.image}.get(role)
        return override or runtime.stage_images.get(role.value) or runtime.image

    def worker(self, index: int) -> WorkerPlan:
        name = f"{self.dep.metadata.name}-w{index}"
        ctx = adapters.ProcessContext(
            worker=name, revision=self.revision, host="127.0.0.1" if self.local else None
        )
        if self.spec.runtime.type is not RuntimeType.builtin:
            pods = [self._third_party_pod(index, name)]
        elif self.spec.gpu.tier is GpuTier.cpu:
            pods = [self._cpu_pod(index, name, ctx)]
        else:
            pods = self._split_pods(index, name, ctx)
        final = tuple(
            p.model_copy(update={"revision": pod_revision(p, worker=name, revision=self.revision)})
            for p in pods
        )
        return WorkerPlan(
            index=index,
            name=name,
            revision=self.revision,
            api_url=f"http://{final[0].address}",
            gpus=self.allocation.total,
            pods=final,
        )

    def _pod(
        self,
        index: int,
        worker: str,
        role: Role,
        *,
        stages: tuple[Stage, ...],
        logical: tuple[int, ...],
        container: Container,
        rank: int = 0,
        nnodes: int = 1,
    ) -> StagePod:
        suffix = f"-{rank}" if rank else ""
        hostname = f"{role.value}{suffix}"
        port = self.port(index, role)
        return StagePod(
            role=role,
            name=f"{worker}-{role.value}{suffix}",
            hostname=hostname,
            stages=stages,
            logical_gpus=logical,
            node_rank=rank,
            nnodes=nnodes,
            address=self.address(worker, hostname, port),
            revision="",  # filled in by worker() once the pod is complete
            container=container,
        )

    def _cpu_pod(self, index: int, worker: str, ctx: adapters.ProcessContext) -> StagePod:
        port = self.port(index, Role.worker)
        thinker = self.spec.stages.thinker.resources
        resources = thinker if (thinker.cpu or thinker.memory) else self.spec.stages.preprocessing.resources
        container = Container(
            image=self.image(Role.worker),
            command=adapters.builtin_serve(self.spec, ctx, port=port, remote={}),
            ports={PORT_NAMES[Role.worker]: port},
            cpu=resources.cpu,
            memory=resources.memory,
            readiness_path="/ready",
            liveness_path="/health",
        )
        return self._pod(index, worker, Role.worker, stages=self.stages, logical=(), container=container)

    def _third_party_pod(self, index: int, worker: str) -> StagePod:
        spec, alloc = self.spec, self.allocation
        port = self.port(index, Role.worker)
        host = "127.0.0.1" if self.local else "0.0.0.0"
        if spec.runtime.type is RuntimeType.sglang_omni:
            command = adapters.sglang_serve(
                spec,
                host=host,
                port=port,
                thinker=alloc.thinker,
                talker=alloc.talker,
                vision=alloc.image_encoder,
                vision_dedicated=alloc.image_encoder_dedicated,
                mem_fraction=self.mem_fraction,
            )
        else:
            command = adapters.vllm_serve(
                spec,
                host="127.0.0.1" if self.local else None,
                port=port,
                stage_config_path=f"{self.config_dir}/{adapters.VLLM_STAGE_CONFIG}",
            )
        logical = tuple(range(alloc.total))
        resources = spec.stages.thinker.resources
        container = Container(
            image=self.image(Role.worker),
            command=command,
            env=self.gpu_env(index, logical),
            ports={PORT_NAMES[Role.worker]: port},
            cpu=resources.cpu,
            memory=resources.memory,
            gpus=alloc.total,
            # Neither third-party server has /ready; /health answers once the engine is up.
            readiness_path="/health",
            liveness_path="/health",
        )
        return self._pod(index, worker, Role.worker, stages=self.stages, logical=logical, container=container)

    def _split_pods(self, index: int, worker: str, ctx: adapters.ProcessContext) -> list[StagePod]:
        spec, alloc = self.spec, self.allocation
        present = set(self.stages)
        with_thinker = {Stage.audio_encoder, Stage.mm_aggregate, Stage.thinker}
        if not alloc.image_encoder_dedicated:
            with_thinker.add(Stage.image_encoder)
        roles: list[tuple[Role, tuple[Stage, ...]]] = [
            (Role.thinker, tuple(s for s in self.stages if s in with_thinker)),
        ]
        if alloc.talker:
            talker_stages = {Stage.talker, Stage.segmenter, Stage.talker_stream} & present
            roles.append((Role.talker, tuple(s for s in self.stages if s in talker_stages)))
        if alloc.image_encoder_dedicated:
            roles.append((Role.image_encoder, (Stage.image_encoder,)))

        pods: list[StagePod] = []
        thinker_pods = self._thinker_pods(index, worker, ctx, roles[0][1])
        for role, stages in roles[1:]:
            pods.append(self._gpu_stage_pod(index, worker, ctx, role, stages))
        remote: dict[Stage, str] = {}
        for pod in [thinker_pods[0], *pods]:
            for stage in pod.stages:
                remote[stage] = pod.address
        api_port = self.port(index, Role.api)
        api_resources = spec.stages.preprocessing.resources
        api = Container(
            image=self.image(Role.api),
            command=adapters.builtin_serve(
                spec, ctx, port=api_port, remote={s: remote[s] for s in self.stages if s in remote}
            ),
            ports={PORT_NAMES[Role.api]: api_port},
            cpu=api_resources.cpu,
            memory=api_resources.memory,
            readiness_path="/ready",
            liveness_path="/health",
        )
        api_stages = tuple(s for s in self.stages if s not in remote)
        return [
            self._pod(index, worker, Role.api, stages=api_stages, logical=(), container=api),
            *thinker_pods,
            *pods,
        ]

    def _thinker_pods(
        self, index: int, worker: str, ctx: adapters.ProcessContext, stages: tuple[Stage, ...]
    ) -> list[StagePod]:
        spec, alloc = self.spec, self.allocation
        tp = len(alloc.thinker)
        per_pod = tp // self.nnodes
        port = self.port(index, Role.thinker)
        resources = spec.stages.thinker.resources
        vision_here = not alloc.image_encoder_dedicated
        pods = []
        for rank in range(self.nnodes):
            logical = alloc.thinker[rank * per_pod : (rank + 1) * per_pod]
            local_gpus = tuple(range(per_pod))
            placement = adapters.thinker_placement(
                tp=tp,
                local_gpus=local_gpus,
                vision_tp=len(alloc.image_encoder) if vision_here and rank == 0 else None,
                mem_fraction=self.mem_fraction,
            )
            pod_stages = stages if rank == 0 else (Stage.thinker,)
            env = self.gpu_env(index, logical)
            ports = {PORT_NAMES[Role.thinker]: port}
            if self.nnodes > 1:
                leader = f"{Role.thinker.value}.{worker}.{self.dep.metadata.namespace}.svc.cluster.local"
                env |= {
                    "MASTER_ADDR": leader,
                    "MASTER_PORT": str(K8S_DIST_PORT),
                    "NODE_RANK": str(rank),
                    "NNODES": str(self.nnodes),
                }
                if rank == 0:
                    ports["dist"] = K8S_DIST_PORT
            container = Container(
                image=self.image(Role.thinker),
                command=adapters.builtin_stage(
                    spec,
                    ctx,
                    stages=pod_stages,
                    port=port,
                    placement=placement,
                    extra=spec.stages.thinker.args,
                ),
                env=env,
                ports=ports,
                cpu=resources.cpu,
                memory=resources.memory,
                gpus=per_pod,
            )
            pods.append(
                self._pod(
                    index,
                    worker,
                    Role.thinker,
                    stages=pod_stages,
                    logical=logical,
                    container=container,
                    rank=rank,
                    nnodes=self.nnodes,
                )
            )
        return pods

    def _gpu_stage_pod(
        self, index: int, worker: str, ctx: adapters.ProcessContext, role: Role, stages: tuple[Stage, ...]
    ) -> StagePod:
        spec, alloc = self.spec, self.allocation
        port = self.port(index, role)
        if role is Role.talker:
            logical, placement = alloc.talker, ["--talker-gpu", "0"]
            resources, extra = spec.stages.talker.resources, spec.stages.talker.args
        else:
            logical = alloc.image_encoder
            local = adapters.gpu_list(list(range(len(logical))))
            placement = ["--image-encoder-tp-size", str(len(logical)), "--image-encoder-gpus", local]
            resources, extra = spec.stages.image_encoder.resources, []
        container = Container(
            image=self.image(role),
            command=adapters.builtin_stage(
                spec, ctx, stages=stages, port=port, placement=placement, extra=extra
            ),
            env=self.gpu_env(index, logical),
            ports={PORT_NAMES[role]: port},
            cpu=resources.cpu,
            memory=resources.memory,
            gpus=len(logical),
        )
        return self._pod(index, worker, role, stages=stages, logical=logical, container=container)


def _router(dep: OmniDeployment, *, target: Target, router_port: int, workers_file: str) -> RouterPlan:
    spec, name = dep.spec, dep.metadata.name
    router = spec.router
    limits = [
        "--session-header",
        router.session_header,
        "--max-sessions-per-worker",
        str(router.limits.max_sessions_per_worker),
    ]
    if target is Target.local:
        port = router_port
        command = ["omni", "router", "--port", str(port), "--workers-file", workers_file, *limits]
        service_port = router_port
    else:
        port = K8S_PORTS[Role.api]
        command = ["omni", "router", "--port", str(port), "--source", "kubernetes"]
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
            cpu=ROUTER_CPU,
            memory=ROUTER_MEMORY,
            readiness_path="/health",
            liveness_path="/health",
        ),
    )
