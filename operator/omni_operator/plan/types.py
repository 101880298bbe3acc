"""The placement Plan: what the planner decides and every realiser (render/, local/) consumes.

A Plan is plain data (frozen pydantic models, JSON-serialisable) so it can be compared exactly in
table tests, written into a ConfigMap, and turned into pods or local processes without re-deciding
anything. GPU ids in a Plan are *logical*, counted from 0 inside one worker; Kubernetes maps them to
the pod's own devices, local mode adds the worker's offset on the host.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from omni_runtime.contract.stages import Stage


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Role(StrEnum):
    """A stage pod's role inside a worker."""

    worker = "worker"  # every stage in one pod/process (CPU builtin, third-party runtimes)
    api = "api"  # builtin split layout: worker API + preprocessing + decode (CPU)
    thinker = "thinker"  # encoders-with-thinker + mm_aggregate + thinker TP ranks
    talker = "talker"  # talker (+ talker_stream, the vocoder)
    image_encoder = "image-encoder"  # dedicated vision ranks


class Target(StrEnum):
    kubernetes = "kubernetes"
    local = "local"


class Container(Frozen):
    image: str
    command: tuple[str, ...] = Field(description="Full argv of the process.")
    env: dict[str, str] = Field(default_factory=dict)
    ports: dict[str, int] = Field(default_factory=dict, description="Port name -> port number.")
    cpu: str | None = None
    memory: str | None = None
    gpus: int = 0
    readiness_path: str | None = Field(
        default=None, description="HTTP readiness path on the main port; None probes the main port over TCP."
    )
    liveness_path: str | None = Field(
        default=None, description="HTTP liveness path on the main port; None probes the main port over TCP."
    )
    startup_s: int | None = Field(
        default=None, description="Start-up window before liveness counts; None: the renderer's default."
    )
    probe_timeout_s: int | None = Field(
        default=None, description="Seconds each probe may take; None: the Kubernetes default (1 s)."
    )


class StagePod(Frozen):
    role: Role
    name: str = Field(description="Pod name (Kubernetes) or process name (local).")
    hostname: str = Field(description="Pod hostname under the worker's headless Service.")
    stages: tuple[Stage, ...]
    logical_gpus: tuple[int, ...] = Field(default=(), description="Worker-local logical GPU ids.")
    node_rank: int = 0
    nnodes: int = 1
    address: str = Field(description="host:port peers use to reach this pod's main port.")
    revision: str = Field(description="Hash of this pod's template; a change replaces only this role.")
    container: Container


class WorkerPlan(Frozen):
    index: int
    name: str
    revision: str = Field(description="Hash of the whole worker template.")
    api_url: str = Field(description="Base URL of the worker's OpenAI-compatible API.")
    gpus: int
    pods: tuple[StagePod, ...]


class RouterPlan(Frozen):
    replicas: int
    port: int
    session_header: str
    service_type: str
    auth_secret: str | None = None
    auth_key: str | None = None
    container: Container


class Scheduling(Frozen):
    """Where GPU pods may run and how a worker's pods stay together (from spec.gpu)."""

    gpu_resource_name: str = "nvidia.com/gpu"
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[dict[str, str | int], ...] = Field(
        default=(), description="Kubernetes tolerations, camelCase keys as in a Pod spec."
    )
    topology_key: str = "kubernetes.io/hostname"


class ModelVolume(Frozen):
    """How the checkpoint reaches the containers (from spec.model.source)."""

    source: str = Field(description="pvc, hostPath, image or tiny.")
    mount_path: str = Field(description="Checkpoint directory inside the containers (spec.model.path).")
    claim_name: str | None = None
    sub_path: str | None = None
    host_path: str | None = None


class Plan(Frozen):
    deployment: str
    namespace: str
    target: Target
    model_name: str
    architecture: str = Field(description="Resolved architecture (never 'auto' when it could be resolved).")
    runtime: str
    runtime_version: str | None = Field(
        default=None, description="Release of a peer runtime (its dialect); None for the builtin runtime."
    )
    pipeline: str
    stages: tuple[Stage, ...] = Field(description="Stages of the pipeline variant in graph order.")
    edges: tuple[tuple[Stage, Stage], ...]
    gpu_tier: str
    gpu_memory_gb: float
    mem_fraction_static: float
    gpus_per_worker: int
    revision: str
    workers: tuple[WorkerPlan, ...]
    router: RouterPlan
    config_files: dict[str, str] = Field(
        default_factory=dict,
        description="Files for the deployment's ConfigMap (e.g. a vllm-omni deploy config).",
    )
    scheduling: Scheduling = Field(default_factory=Scheduling)
    model_volume: ModelVolume | None = None
    image_pull_policy: str = "IfNotPresent"
    denied_networks: tuple[str, ...] = Field(
        default=(),
        description="Ranges stage pods never reach (spec.media.deniedNetworks), normalized CIDRs: the "
        "egress policy's exceptions beside the private ones.",
    )


class PlanError(ValueError):
    """An impossible or invalid spec, with the field path and the fix in the message."""

    def __init__(self, field: str, reason: str, fix: str) -> None:
        self.field = field
        self.reason = reason
        self.fix = fix
        super().__init__(f"{field}: {reason}; {fix}")
