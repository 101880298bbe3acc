"""The OmniDeployment spec as pydantic models: the single source of truth.

Field descriptions become CRD descriptions, defaults and bounds live on the fields, and the
YAML spelling is camelCase (aliases) while Python code uses snake_case names.
"""

from __future__ import annotations

import ipaddress
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.alias_generators import to_camel

from omni_operator.api import runtime_env
from omni_operator.api.kube_rules import (
    ABSOLUTE_PATH_PATTERN,
    DNS_SUBDOMAIN,
    EFFECT_PATTERN,
    LABEL_KEY_FIX,
    LABEL_KEY_MAX_LENGTH,
    LABEL_KEY_REASON,
    LABEL_KEY_RULE,
    LABEL_VALUE_MAX_LENGTH,
    LABEL_VALUE_PATTERN,
    OPERATOR_PATTERN,
    PATH_ELEMENT,
    PATH_MAX_LENGTH,
    RESOURCE_NAME_RULE,
    TOLERATION_RULES,
    is_label_key,
    toleration_problem,
)
from omni_operator.api.streaming_input import StreamingInputSpec

GROUP = "omni.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "OmniDeployment"
PLURAL = "omnideployments"
SINGULAR = "omnideployment"
SHORT_NAMES = ["omnid"]


# A Kubernetes resource quantity without a sign (resource.Quantity): digits with an optional
# fraction, then a binary (Ki..Ei) or decimal (n, u, m, k, M..E) suffix or a short exponent. The
# renderer reads a CPU-only container's CPU as a number (OMP_NUM_THREADS): "inf" or "nan" would
# have crashed it, and "32GB" would have failed only at pod creation.
QUANTITY_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]{1,2})?$"
# A DNS-1123 subdomain (Secret and PersistentVolumeClaim names) and label (namespaces).
DNS_SUBDOMAIN_PATTERN = rf"^{DNS_SUBDOMAIN}$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A key of a Secret that also names a file under the mount: letters, digits, '-', '_' and '.', not
# starting with '..' (nor '.' or '..' alone).
SECRET_KEY_PATTERN = r"^\.?[-_a-zA-Z0-9][-._a-zA-Z0-9]*$"
# A volume sub-path as Kubernetes takes it: relative, no '..' element (RE2, as the API server checks
# CRD patterns; kube_rules.PATH_ELEMENT).
SUB_PATH_PATTERN = rf"^{PATH_ELEMENT}(/{PATH_ELEMENT})*/?$"
# The longest duration in seconds a spec may give: int32, which every consumer (Kubernetes, the
# rollout clock in float seconds, the router's timeout) holds.
MAX_SECONDS = 2**31 - 1
# Stage pod roles (plan.types.Role) whose image runtime.stageImages may override.
STAGE_IMAGE_ROLES = ("worker", "api", "thinker", "talker", "image-encoder")
STAGE_IMAGES_REASON = "is not a stage pod role"
STAGE_IMAGES_FIX = "use one of " + ", ".join(STAGE_IMAGE_ROLES)
NUL_REASON = "holds a NUL character, which no command line or environment variable can carry"
NUL_FIX = "remove it"


def check_no_nul(value: object) -> None:
    """ValueError (EntryError for a mapping's entry) when a field's strings hold a NUL character.
    Nested spec objects check their own fields."""
    if isinstance(value, str) and "\x00" in value:
        raise ValueError(f"{NUL_REASON}; {NUL_FIX}")
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if isinstance(item, str) and "\x00" in item:
                raise ValueError(f"item {i} {NUL_REASON}; {NUL_FIX}")
    if isinstance(value, dict):
        for key, item in value.items():
            if "\x00" in str(key):
                raise runtime_env.EntryError(repr(key), reason=f"the name {NUL_REASON}", fix=NUL_FIX)
            if isinstance(item, str) and "\x00" in item:
                raise runtime_env.EntryError(str(key), reason=NUL_REASON, fix=NUL_FIX)


class SpecModel(BaseModel):
    """Base for every spec object: camelCase in YAML, unknown fields rejected, numbers finite, no
    NUL character in a string (every string ends up on a command line, in an environment or in a
    manifest)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_enum_values=False,
        allow_inf_nan=False,
    )

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        check_no_nul(value)
        return value


class Architecture(StrEnum):
    auto = "auto"
    qwen2_5_omni = "qwen2_5_omni"
    qwen3_omni = "qwen3_omni"
    ming_omni = "ming_omni"
    minicpm_o = "minicpm_o"


class LoadFormat(StrEnum):
    auto = "auto"
    dummy = "dummy"


class SourceType(StrEnum):
    pvc = "pvc"
    host_path = "hostPath"
    image = "image"
    tiny = "tiny"


class RuntimeType(StrEnum):
    builtin = "builtin"
    sglang_omni = "sglang-omni"
    vllm_omni = "vllm-omni"


class PipelineVariant(StrEnum):
    text = "text"
    speech = "speech"
    streaming_speech = "streaming-speech"
    duplex = "duplex"


class Quantization(StrEnum):
    fp8 = "fp8"
    int8 = "int8"
    awq = "awq"
    gptq = "gptq"


class ImageEncoderPlacement(StrEnum):
    with_thinker = "withThinker"
    dedicated = "dedicated"


class GpuTier(StrEnum):
    cpu = "cpu"
    a100_40gb = "a100-40gb"
    a100_80gb = "a100-80gb"
    l40s = "l40s"
    h100 = "h100"
    h200 = "h200"
    b200 = "b200"


class ServiceType(StrEnum):
    cluster_ip = "ClusterIP"
    node_port = "NodePort"
    load_balancer = "LoadBalancer"


class ModelSource(SpecModel):
    """Where the checkpoint comes from inside the stage pods."""

    type: SourceType = Field(
        default=SourceType.image,
        description="pvc: a PersistentVolumeClaim mounted read-only; hostPath: a directory on the node; "
        "image: baked into the runtime image at model.path; tiny: the runtime writes the tiny "
        "random-weight checkpoint of model.architecture itself (qwen2_5_omni, the default, or qwen3_omni; "
        "builtin runtime only, for tests and demos).",
    )
    claim_name: str | None = Field(
        default=None,
        description="PersistentVolumeClaim name (type pvc).",
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
    )
    sub_path: str | None = Field(
        default=None,
        max_length=PATH_MAX_LENGTH,
        pattern=SUB_PATH_PATTERN,
        description="Sub-path inside the volume (type pvc): relative, without '..' elements.",
    )
    host_path: str | None = Field(
        default=None,
        max_length=PATH_MAX_LENGTH,
        pattern=ABSOLUTE_PATH_PATTERN,
        description="Node directory (type hostPath): absolute, without '..' elements; under omni up the "
        "checkpoint directory on this machine, read in place.",
    )

    @model_validator(mode="after")
    def _source_fields(self) -> ModelSource:
        if self.type is SourceType.pvc and not self.claim_name:
            raise ValueError(
                "claimName is required when type is pvc; set claimName to the PersistentVolumeClaim holding the checkpoint"
            )
        if self.type is SourceType.host_path and not self.host_path:
            raise ValueError(
                "hostPath is required when type is hostPath; set hostPath to the node directory holding the checkpoint"
            )
        return self


class ModelSpec(SpecModel):
    """Which model the deployment serves and how it is loaded."""

    name: str = Field(
        description="Served model name: the `model` field clients send to the OpenAI API.",
        min_length=1,
        max_length=128,
    )
    path: str = Field(
        default="/models/model",
        description="Checkpoint directory as seen inside the stage containers: absolute, without '..' "
        "elements (the volume's mount path for pvc and hostPath sources; under omni up, where an image "
        "source's checkpoint is on this machine).",
        max_length=PATH_MAX_LENGTH,
        pattern=ABSOLUTE_PATH_PATTERN,
    )
    source: ModelSource = Field(default_factory=lambda: ModelSource(), description="Checkpoint source.")
    architecture: Architecture = Field(
        default=Architecture.auto,
        description="Model family; auto reads it from the served name or the checkpoint's config.json.",
    )
    load_format: LoadFormat = Field(
        default=LoadFormat.auto,
        description="auto loads the checkpoint's weights; dummy builds the full-size model with random weights "
        "(for benchmarks).",
    )
    trust_remote_code: bool = Field(default=False, description="Allow model code shipped in the checkpoint.")
    voice: str | None = Field(default=None, description="Default talker voice (speaker name).")
    thinker_params_billions: float | None = Field(
        default=None,
        gt=0,
        description="Thinker parameter count in billions, for the fit check; defaults to the architecture's "
        "known size.",
    )


class RuntimeSpec(SpecModel):
    """Which serving runtime runs in the pods."""

    type: RuntimeType = Field(default=RuntimeType.builtin, description="builtin, sglang-omni or vllm-omni.")
    version: str | None = Field(
        default=None,
        min_length=1,
        description="Release of a peer runtime (sglang-omni: 0.1.9; vllm-omni: 0.30.0); selects its command-line "
        "and config dialect and must match the image. Unset: the newest supported release. The builtin runtime "
        "is versioned by its image and takes none.",
    )
    image: str = Field(
        default="ghcr.io/omni-dev/omni-runtime:0.1.0",
        description="Container image for stage pods, the worker API and the router.",
        min_length=1,
    )
    image_pull_policy: str = Field(
        default="IfNotPresent", pattern="^(Always|IfNotPresent|Never)$", description="Image pull policy."
    )
    stage_images: dict[str, Annotated[str, Field(min_length=1)]] = Field(
        default_factory=dict,
        max_length=len(STAGE_IMAGE_ROLES),
        description="Per stage-pod image overrides keyed by stage pod role ("
        + ", ".join(STAGE_IMAGE_ROLES)
        + "; worker is the one pod of a CPU or peer-runtime worker).",
    )
    extra_args: list[str] = Field(
        default_factory=list, description="Extra arguments for every runtime process."
    )
    env: dict[str, Annotated[str, Field(max_length=runtime_env.VALUE_MAX_LENGTH)]] = Field(
        default_factory=dict,
        description="Environment variables (name: string value) for every stage process of every "
        "worker, on every runtime: the stage pods' containers on a cluster and the processes `omni up` "
        "starts alike; not the router, which reads none of them. For the runtime's switches, e.g. "
        "OMNI_BUSY_STREAMS: '8' (the builtin runtime's OMNI_* variables), or a peer runtime's own. "
        "Names match [A-Za-z_][A-Za-z0-9_]*; the names the operator sets itself are refused ("
        + ", ".join(runtime_env.OPERATOR_ENV)
        + f"); values hold at most {runtime_env.VALUE_MAX_LENGTH} characters. For the builtin runtime its "
        "switches' values are checked too (flags: 1/0, on/off, true/false, yes/no; a value switch's "
        "format). OMP_NUM_THREADS set here wins over the thread count a CPU-only pod gets from its CPU limit "
        "and the runtime's one thread on a GPU. Part of the worker template: a change rolls the workers "
        "out one by one, like any other pod change.",
    )

    @field_validator("stage_images")
    @classmethod
    def _stage_roles(cls, images: dict[str, str]) -> dict[str, str]:
        for role in images:
            if role not in STAGE_IMAGE_ROLES:
                raise runtime_env.EntryError(role, reason=STAGE_IMAGES_REASON, fix=STAGE_IMAGES_FIX)
        return images

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        return runtime_env.check_env(env, builtin=info.data.get("type") == RuntimeType.builtin)


class Resources(SpecModel):
    """CPU and memory for a stage pod (GPUs come from the plan)."""

    cpu: str | None = Field(
        default=None,
        pattern=QUANTITY_PATTERN,
        max_length=64,
        description="CPU request and limit, a Kubernetes quantity, e.g. '4' or '500m'.",
    )
    memory: str | None = Field(
        default=None,
        pattern=QUANTITY_PATTERN,
        max_length=64,
        description="Memory request and limit, a Kubernetes quantity, e.g. '32Gi' or '512Mi'.",
    )


class ThinkerSpec(SpecModel):
    tensor_parallel_size: int = Field(default=1, ge=1, le=64, description="GPUs the thinker is split across.")
    mem_fraction_static: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description="Share of each GPU's memory for weights and KV cache; defaults by GPU tier "
        "(0.80 for 80 GB parts, 0.90 for 141 GB parts).",
    )
    cpu_offload_gb: int = Field(
        default=0, ge=0, le=65536, description="GiB of weights per GPU offloaded to host memory."
    )
    quantization: Quantization | None = Field(default=None, description="Weight quantization.")
    resources: Resources = Field(default_factory=Resources, description="CPU and memory of the thinker pod.")
    image: str | None = Field(default=None, description="Image override for the thinker pod.")
    args: list[str] = Field(default_factory=list, description="Extra arguments for the thinker process.")


class TalkerSpec(SpecModel):
    enabled: bool | None = Field(
        default=None,
        description="Run a talker; defaults to true for speech, streaming-speech and duplex, false for text.",
    )
    resources: Resources = Field(default_factory=Resources, description="CPU and memory of the talker pod.")
    image: str | None = Field(default=None, description="Image override for the talker pod.")
    args: list[str] = Field(default_factory=list, description="Extra arguments for the talker process.")


class ImageEncoderSpec(SpecModel):
    tensor_parallel_size: int = Field(
        default=1, ge=1, le=16, description="Vision encoder tensor parallelism."
    )
    placement: ImageEncoderPlacement = Field(
        default=ImageEncoderPlacement.with_thinker,
        description="withThinker shares the thinker's GPUs; dedicated takes its own GPUs after the talker's.",
    )
    resources: Resources = Field(default_factory=Resources, description="CPU and memory (dedicated only).")


class AudioEncoderSpec(SpecModel):
    enabled: bool = Field(default=True, description="Accept audio input (runs on the thinker's first GPU).")


class PreprocessingSpec(SpecModel):
    resources: Resources = Field(
        default_factory=lambda: Resources(cpu="2", memory="4Gi"),
        description="CPU and memory of the worker API pod (preprocessing and decode).",
    )


class StagesSpec(SpecModel):
    thinker: ThinkerSpec = Field(default_factory=ThinkerSpec, description="The language model.")
    talker: TalkerSpec = Field(default_factory=TalkerSpec, description="Speech generation (codec + vocoder).")
    image_encoder: ImageEncoderSpec = Field(default_factory=ImageEncoderSpec, description="Vision tower.")
    audio_encoder: AudioEncoderSpec = Field(default_factory=AudioEncoderSpec, description="Audio tower.")
    preprocessing: PreprocessingSpec = Field(
        default_factory=PreprocessingSpec, description="CPU preprocessing and the worker API."
    )


class Toleration(SpecModel):
    """A toleration of the GPU pods, checked as Kubernetes checks a pod's."""

    # kube_rules.TOLERATION_RULES: the rules between its fields, CEL on the toleration in the
    # loader's words (the API server prefixes spec.gpu.tolerations[i] as the loader does).
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [{"rule": r.cel, "message": r.message} for r in TOLERATION_RULES]
        }
    )

    key: str | None = Field(
        default=None,
        max_length=LABEL_KEY_MAX_LENGTH,
        description="Taint key, a label key; empty or unset (with operator Exists): every taint.",
    )
    operator: str | None = Field(
        default=None, pattern=OPERATOR_PATTERN, description="Exists, or Equal (unset: Equal)."
    )
    value: str | None = Field(
        default=None,
        max_length=LABEL_VALUE_MAX_LENGTH,
        pattern=LABEL_VALUE_PATTERN,
        description="Taint value, a label value (operator Equal; Exists takes none).",
    )
    effect: str | None = Field(
        default=None,
        pattern=EFFECT_PATTERN,
        description="NoSchedule, PreferNoSchedule or NoExecute; empty or unset: every effect.",
    )
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated (effect NoExecute only)."
    )

    @model_validator(mode="after")
    def _kubernetes_rules(self) -> Toleration:
        broken = toleration_problem(self.model_dump(by_alias=True, exclude_none=True))
        if broken is not None:
            raise ValueError(broken.message)
        return self


# Names checked as Kubernetes checks them (a label key's prefix length too, which no pattern
# bounds); crdgen carries each rule as CEL on spec in the same words.
GPU_NAME_RULES = {"resource_name": RESOURCE_NAME_RULE, "topology_key": LABEL_KEY_RULE}


class GpuSpec(SpecModel):
    resource_name: str = Field(
        default="nvidia.com/gpu",
        max_length=LABEL_KEY_MAX_LENGTH,
        description="Extended resource that counts GPUs, such as nvidia.com/gpu.",
    )
    tier: GpuTier = Field(default=GpuTier.h100, description="GPU model class; sets memory and defaults.")
    memory_gb: float | None = Field(default=None, gt=0, description="Per-GPU memory override in GB.")
    gpus_per_node: int = Field(
        default=8, ge=1, le=64, description="GPUs on one node; larger thinkers span nodes."
    )
    node_selector: dict[
        str, Annotated[str, Field(max_length=LABEL_VALUE_MAX_LENGTH, pattern=LABEL_VALUE_PATTERN)]
    ] = Field(
        default_factory=dict,
        max_length=64,
        description="Node selector for GPU pods: label keys and values, as Kubernetes takes them.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=64, description="Tolerations for GPU pods."
    )
    topology_key: str = Field(
        default="kubernetes.io/hostname",
        max_length=LABEL_KEY_MAX_LENGTH,
        description="Topology key (a node label key) that keeps a worker's pods together.",
    )

    @field_validator(*GPU_NAME_RULES)
    @classmethod
    def _kubernetes_names(cls, value: str, info: ValidationInfo) -> str:
        rule = GPU_NAME_RULES[str(info.field_name)]
        if not rule.check(value):
            raise ValueError(rule.message)
        return value

    @field_validator("node_selector")
    @classmethod
    def _label_keys(cls, selector: dict[str, str]) -> dict[str, str]:
        for key in selector:
            if not is_label_key(key):
                raise runtime_env.EntryError(key or "''", reason=LABEL_KEY_REASON, fix=LABEL_KEY_FIX)
        return selector


class RouterAuth(SpecModel):
    secret_name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Secret holding accepted API keys, one per line.",
    )
    key: str = Field(
        default="api-keys",
        min_length=1,
        max_length=253,
        pattern=SECRET_KEY_PATTERN,
        description="Key inside the Secret (letters, digits, '-', '_' and '.'; it names the mounted file).",
    )


class RouterLimits(SpecModel):
    max_sessions_per_worker: int = Field(
        default=256, ge=1, le=1 << 20, description="Live sessions one worker accepts."
    )
    max_request_body_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024, le=1 << 40, description="Largest request body."
    )
    request_timeout_seconds: int = Field(
        default=600, ge=1, le=MAX_SECONDS, description="Upstream timeout for one request."
    )


class RouterSpec(SpecModel):
    replicas: int = Field(default=1, ge=0, le=64, description="Router pods.")
    session_header: str = Field(
        default="X-Session-Id",
        pattern=r"^[A-Za-z0-9-]+$",
        description="Request header whose value pins requests to one worker.",
    )
    service_type: ServiceType = Field(default=ServiceType.cluster_ip, description="Router Service type.")
    port: int = Field(default=8000, ge=1, le=65535, description="Router Service port.")
    auth: RouterAuth | None = Field(default=None, description="API-key auth; off when unset.")
    limits: RouterLimits = Field(default_factory=RouterLimits, description="Admission limits.")
    resources: Resources = Field(
        default_factory=lambda: Resources(cpu="1", memory="1Gi"),
        description="CPU and memory of each router pod.",
    )


class RolloutSpec(SpecModel):
    max_surge: int = Field(default=1, ge=0, le=1024, description="Extra workers allowed during a rollout.")
    max_unavailable: int = Field(
        default=0, ge=0, le=1024, description="Workers that may be unavailable during a rollout."
    )
    drain_timeout_seconds: int = Field(
        default=600, ge=0, le=MAX_SECONDS, description="Longest wait for a draining worker."
    )
    progress_deadline_seconds: int = Field(
        default=600,
        ge=1,
        le=MAX_SECONDS,
        description="Time a new worker has to become ready before the rollout stops.",
    )
    paused: bool = Field(default=False, description="Stop the rollout at its next step.")

    @model_validator(mode="after")
    def _can_progress(self) -> RolloutSpec:
        if self.max_surge == 0 and self.max_unavailable == 0:
            raise ValueError(
                "rollout.maxSurge and rollout.maxUnavailable are both 0: a rollout could never progress; "
                "set maxSurge: 1 (default) or maxUnavailable: 1"
            )
        return self


# An exact host name or "*.suffix" (names below suffix), lower case: --allowed-media-domain.
MEDIA_DOMAIN_PATTERN = r"^(\*\.)?[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$"


class MediaSpec(SpecModel):
    """Where workers may fetch media URLs from (image_url, audio_url, video_url with http(s))."""

    allowed_domains: list[Annotated[str, Field(pattern=MEDIA_DOMAIN_PATTERN, max_length=253)]] = Field(
        default_factory=list,
        max_length=64,
        description="Fetch media URLs only from these hosts: an exact name (media.example.com) or the "
        "names below a domain (*.example.com). Empty: any public host. Builtin runtime only "
        "(--allowed-media-domain).",
    )
    allow_private_addresses: bool = Field(
        default=False,
        description="Let media URLs reach loopback, private (RFC 1918, fc00::/7) and 100.64/10 addresses, "
        "for media served inside your network; link-local (the cloud metadata address) stays refused. The "
        "stage pods' egress NetworkPolicy still blocks those ranges: add a NetworkPolicy that allows your "
        "media servers. Builtin runtime only (--allow-private-media-addresses).",
    )
    denied_networks: list[Annotated[str, Field(pattern=r"^[0-9a-fA-F:.]+(/[0-9]{1,3})?$")]] = Field(
        default_factory=list,
        max_length=64,
        description="More address ranges (CIDR) workers never fetch media from and stage pods never "
        "reach: the cluster's pod and Service ranges where they lie outside the private ranges "
        "(--deny-media-network, and the exceptions of the stage pods' egress NetworkPolicy).",
    )

    @model_validator(mode="after")
    def _networks_parse(self) -> MediaSpec:
        for text in self.denied_networks:
            try:
                ipaddress.ip_network(text, strict=False)
            except ValueError:
                raise ValueError(
                    f"deniedNetworks: {text!r} is not an address or CIDR range; write e.g. 10.96.0.0/12"
                ) from None
        return self


class SpeechSpec(SpecModel):
    """Admission by speech capacity: how many speech streams one worker carries at once."""

    max_streams: int | None = Field(
        default=None,
        ge=0,
        le=4096,
        description="Concurrent speech streams per worker (chat completions with audio out, realtime and "
        "video sessions). Past it a worker refuses new ones (HTTP 429 with Retry-After, or a WebSocket "
        "error event and close 1013) and the router sends them to another worker; text is not limited. "
        "0: no limit. Unset: the runtime's default (16). Builtin runtime only (--max-speech-streams).",
    )


class SessionKVSpec(SpecModel):
    """Conversation KV: a session's thinker KV kept between its turns (builtin runtime)."""

    max_mib: int | None = Field(
        default=None,
        ge=0,
        le=1 << 20,
        description="MiB of thinker KV each worker keeps between a session's turns (realtime, duplex, "
        "streaming input, chat with X-Session-Id), so a turn prefills only what is new; least recently "
        "used sessions are evicted first. Unset: the runtime's default, 1024 (on an H100 it lowered the "
        "median wait for first audio at 8 realtime sessions by 20-50 ms); 0: off. Builtin runtime only "
        "(--session-kv-mb on the process that runs the thinker).",
    )


class OmniDeploymentSpec(SpecModel):
    """Desired state of an omni model deployment."""

    model: ModelSpec = Field(description="The model to serve.")
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec, description="The serving runtime.")
    pipeline: PipelineVariant = Field(default=PipelineVariant.speech, description="Pipeline variant.")
    workers: int = Field(default=1, ge=0, le=1024, description="Complete workers (the scale subresource).")
    stages: StagesSpec = Field(default_factory=StagesSpec, description="Per-stage placement and settings.")
    gpu: GpuSpec = Field(default_factory=GpuSpec, description="GPU class and scheduling.")
    router: RouterSpec = Field(default_factory=RouterSpec, description="Session router.")
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec, description="Worker-by-worker rollout strategy."
    )
    media: MediaSpec = Field(default_factory=MediaSpec, description="Remote media URLs the workers fetch.")
    streaming_input: StreamingInputSpec = Field(
        default_factory=StreamingInputSpec,
        description="Streaming-input sessions of the workers (builtin runtime only).",
    )
    speech: SpeechSpec = Field(
        default_factory=SpeechSpec, description="Speech streams a worker admits at once."
    )
    session_kv: SessionKVSpec = Field(
        default_factory=SessionKVSpec, description="Thinker KV kept between a session's turns."
    )


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=40, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    namespace: str = Field(default="default", min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class OmniDeployment(BaseModel):
    """A whole OmniDeployment object as read from YAML or the API server."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    api_version: Annotated[str, Field(alias="apiVersion")] = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta
    spec: OmniDeploymentSpec
    status: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _type_meta(self) -> OmniDeployment:
        if self.api_version != API_VERSION:
            raise ValueError(f"apiVersion must be {API_VERSION}, got {self.api_version!r}")
        if self.kind != KIND:
            raise ValueError(f"kind must be {KIND}, got {self.kind!r}")
        return self
