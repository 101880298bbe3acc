"""Worker layouts: the stage pods of one worker, their names, ports, addresses and commands.

- builtin on tier cpu: one `worker` pod per worker running every stage (`omni serve --device cpu`).
- builtin on GPUs: `api` (CPU: preprocessing, decode, the segmenter, the OpenAI API), `thinker` (encoders that sit
  with it, mm_aggregate, the TP ranks; one pod per node when TP exceeds a node), `talker`, and
  `image-encoder` when vision is dedicated. The api pod reaches the others by --remote-stage.
- sglang-omni / vllm-omni: one `worker` pod holding all of the worker's GPUs.

Names: worker `{deployment}-w{i}`, pod `{worker}-{role}` (`-{rank}` for thinker followers), pod
hostname = role under the worker's headless Service. GPU ids in commands are pod-local;
StagePod.logical_gpus are worker-level.
"""

from __future__ import annotations

from dataclasses import dataclass

from omni_operator.api.spec import (
    Architecture,
    GpuTier,
    OmniDeployment,
    OmniDeploymentSpec,
    RuntimeType,
    SourceType,
)
from omni_operator.plan import adapters, rules
from omni_operator.plan.catalogue import peer_pod_size, runtime_version
from omni_operator.plan.revisions import pod_revision
from omni_operator.plan.types import Container, Role, Stage, StagePod, Target, WorkerPlan
from omni_runtime.contract.stages import REMOTABLE, with_colocated

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
PEER_PROBE_TIMEOUT_S = 5
PORT_NAMES: dict[Role, str] = {
    Role.worker: "http",
    Role.api: "http",
    Role.thinker: "thinker",
    Role.talker: "talker",
    Role.image_encoder: "image-encoder",
}


def process_model_path(spec: OmniDeploymentSpec, *, local: bool) -> str:
    """Where the stage processes find the checkpoint: in pods the volume's mount path
    (spec.model.path); under `omni up` a hostPath source's directory itself (the node is this
    machine), else spec.model.path on this machine."""
    source = spec.model.source
    if local and source.type is SourceType.host_path and source.host_path:
        return source.host_path
    return spec.model.path


@dataclass(frozen=True)
class WorkerLayout:
    """Names, ports, addresses and pods of the workers of one deployment."""

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

    @property
    def model_path(self) -> str:
        return process_model_path(self.spec, local=self.local)

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
            worker=name,
            revision=self.revision,
            host="127.0.0.1" if self.local else None,
            model_path=self.model_path,
            architecture=self.architecture,
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
        # spec.runtime.env reaches every stage process here, once: the pod revision, the rendered
        # pods and local mode all take it from the plan. The names the layout sets itself are
        # refused in the spec (api/runtime_env), so no name comes from both.
        container = container.model_copy(update={"env": {**self.spec.runtime.env, **container.env}})
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
                version=runtime_version(spec.runtime.type, spec.runtime.version) or "",
                model_path=self.model_path,
                architecture=self.architecture,
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
                model_path=self.model_path,
                host="127.0.0.1" if self.local else None,
                port=port,
                deploy_config_path=f"{self.config_dir}/{adapters.VLLM_DEPLOY_CONFIG}",
            )
        logical = tuple(range(alloc.total))
        thinker = spec.stages.thinker
        resources = thinker.resources
        size = peer_pod_size(
            self.architecture,
            gpus=alloc.total,
            cpu_offload_gb=thinker.cpu_offload_gb or 0,
            tp=len(alloc.thinker),
        )
        container = Container(
            image=self.image(Role.worker),
            command=command,
            env=self.gpu_env(index, logical),
            ports={PORT_NAMES[Role.worker]: port},
            # Host RAM to read the checkpoint through and CPUs for the API and CPU stages, from
            # the catalogue; spec.stages.thinker.resources overrides each.
            cpu=resources.cpu or (size.cpu if size else None),
            memory=resources.memory or (size.memory if size else None),
            gpus=alloc.total,
            # Neither server has /ready. sglang-omni 0.1.9 listens only once its stages are loaded
            # and answers /health 503 ("starting") until warm-up ends, then 200 (503 when a stage
            # dies); vllm-omni 0.30.0 serves HTTP only once its engines are built, /health 200 or
            # 503 when an engine is dead. Both check their engines on /health: 5 s to answer.
            readiness_path="/health",
            liveness_path="/health",
            startup_s=size.startup_s if size else None,
            probe_timeout_s=PEER_PROBE_TIMEOUT_S,
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
            talker_stages = with_colocated({Stage.talker}) & present
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
                spec,
                ctx,
                port=api_port,
                remote={s: remote[s] for s in self.stages if s in remote and s in REMOTABLE},
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
