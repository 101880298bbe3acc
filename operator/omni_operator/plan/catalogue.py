"""What the planner knows about model families and GPU tiers.

Kept apart from the rules so adding a model or a GPU is a data change: parameter counts feed the
fit check, head counts feed the vision-TP rule, tier memory feeds both the fit check and the
memFractionStatic default. Sizes are the published checkpoints' thinker sizes (text model plus the
towers that sit with it), rounded to a tenth of a billion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from omni_operator.api.spec import (
    Architecture,
    GpuTier,
    ModelSpec,
    PipelineVariant,
    Quantization,
    RuntimeType,
)

VISION_HEADS = 16  # every supported family's vision tower has 16 attention heads


@dataclass(frozen=True)
class ArchitectureInfo:
    thinker_params_billions: float
    talker_params_billions: float
    vision_heads: int
    pipelines: frozenset[PipelineVariant]


_SPEECH = frozenset({PipelineVariant.text, PipelineVariant.speech, PipelineVariant.streaming_speech})

# ``pipelines``: what the builtin runtime serves for the family. Its Qwen families have duplex:
# streaming speech with full-duplex realtime sessions (barge-in, the thinker's listen/speak probe).
ARCHITECTURES: dict[Architecture, ArchitectureInfo] = {
    Architecture.qwen2_5_omni: ArchitectureInfo(7.6, 0.7, VISION_HEADS, _SPEECH | {PipelineVariant.duplex}),
    Architecture.qwen3_omni: ArchitectureInfo(30.5, 3.0, VISION_HEADS, _SPEECH | {PipelineVariant.duplex}),
    # Ming-flash-omni: a 100B-class MoE thinker; the field runs it at TP4 on 80 GB parts.
    Architecture.ming_omni: ArchitectureInfo(103.0, 0.5, VISION_HEADS, _SPEECH),
    Architecture.minicpm_o: ArchitectureInfo(
        8.2,
        0.5,
        VISION_HEADS,
        _SPEECH | {PipelineVariant.duplex},
    ),
}

# The builtin runtime's tiny random-weight checkpoints (model.source.type tiny): the family
# (config.json model_type, `omni serve --tiny-family`) each architecture's tiny checkpoint has.
TINY_FAMILIES: dict[Architecture, str] = {
    Architecture.auto: "qwen2_5_omni",
    Architecture.qwen2_5_omni: "qwen2_5_omni",
    Architecture.qwen3_omni: "qwen3_omni_moe",
}

# Substrings of the served name or checkpoint path (lower-cased, '_' read as '-') that name a family.
# Order matters: the first match wins, so the more specific spelling comes first.
_NAME_HINTS: tuple[tuple[str, Architecture], ...] = (
    ("qwen2.5-omni", Architecture.qwen2_5_omni),
    ("qwen2-5-omni", Architecture.qwen2_5_omni),
    ("qwen3-omni", Architecture.qwen3_omni),
    ("minicpm-o", Architecture.minicpm_o),
    ("minicpmo", Architecture.minicpm_o),
    ("ming", Architecture.ming_omni),
)

TIER_MEMORY_GB: dict[GpuTier, float] = {
    GpuTier.cpu: 0.0,
    GpuTier.a100_40gb: 40.0,
    GpuTier.a100_80gb: 80.0,
    GpuTier.l40s: 48.0,
    GpuTier.h100: 80.0,
    GpuTier.h200: 141.0,
    GpuTier.b200: 180.0,
}

# 0.90 only where there is room for it: on 80 GB parts 0.90 leaves too little for activations.
_MEM_FRACTION: dict[GpuTier, float] = {GpuTier.h200: 0.90, GpuTier.b200: 0.90}
DEFAULT_MEM_FRACTION = 0.80

BYTES_PER_PARAM: dict[Quantization | None, float] = {
    None: 2.0,  # bf16
    Quantization.fp8: 1.0,
    Quantization.int8: 1.0,
    Quantization.awq: 0.5,
    Quantization.gptq: 0.5,
}


def resolve_architecture(model: ModelSpec) -> Architecture:
    """The model family: the declared one, else a hint in the served name or path, else auto."""
    if model.architecture is not Architecture.auto:
        return model.architecture
    for text in (model.name, model.path):
        lowered = text.lower().replace("_", "-")
        for hint, architecture in _NAME_HINTS:
            if hint in lowered:
                return architecture
    return Architecture.auto


def default_mem_fraction(tier: GpuTier) -> float:
    return _MEM_FRACTION.get(tier, DEFAULT_MEM_FRACTION)


def tier_memory_gb(tier: GpuTier, override: float | None) -> float:
    return override if override is not None else TIER_MEMORY_GB[tier]


# --- Peer runtimes: what each supported release serves, read from its own registries ---
#
# sglang-omni: sglang_omni/models/<family>/config.py (`architecture`, `Variants`, stage names).
# vllm-omni: vllm_omni/config/pipeline_registry.py (OMNI_PIPELINES) and the shipped deploy files
# under vllm_omni/deploy/ that each pipeline names. tests/unit/peers checks every rendered command
# and deploy config against the released wheels' own parsers and loaders.


@dataclass(frozen=True)
class SglangVariant:
    """One `sgl-omni serve --variant` of one family: its name and the stage names placement writes."""

    name: str
    talker_stages: tuple[str, ...] = ()  # the stages that sit on the talker GPU
    realtime: bool = False  # serves only /v1/realtime: needs --enable-realtime
    # The variant runs the thinker in a process shared with CPU stages, which a TP thinker cannot
    # share: with TP > 1 the thinker gets its own process (`--thinker.process thinker`).
    shared_thinker_process: bool = False


@dataclass(frozen=True)
class SglangFamily:
    architecture: str  # the HF architecture its registry resolves the checkpoint by
    variants: dict[PipelineVariant, SglangVariant]
    vision_tp: bool  # the image_encoder stage takes tp_size and GPU lists


@dataclass(frozen=True)
class VllmVariant:
    """One vllm-omni pipeline of one family: the shipped deploy file the overlay layers on."""

    deploy_file: str  # under vllm_omni/deploy/ in the release
    pipeline: str | None  # `pipeline:` registry key when the file's default is not the one wanted
    stages: int  # stage 0 is the thinker; stages 1.. sit on the talker GPU
    session_mode: str | None = None  # `session_mode:` to write when the file's differs
    async_chunk: bool | None = None  # `async_chunk:` to write (chunked streaming between stages)


SGLANG_OMNI: dict[str, dict[Architecture, SglangFamily]] = {
    "0.1.9": {
        Architecture.ming_omni: SglangFamily(
            "BailingMM2NativeForConditionalGeneration",
            {
                PipelineVariant.text: SglangVariant("text"),
                PipelineVariant.speech: SglangVariant("speech", ("talker",)),
                PipelineVariant.streaming_speech: SglangVariant("streaming_speech", ("talker_stream",)),
            },
            vision_tp=True,
        ),
        Architecture.qwen3_omni: SglangFamily(
            "Qwen3OmniMoeForConditionalGeneration",
            {
                PipelineVariant.text: SglangVariant("text", shared_thinker_process=True),
                PipelineVariant.speech: SglangVariant("speech", ("talker_ar",)),
            },
            vision_tp=False,
        ),
        Architecture.minicpm_o: SglangFamily(
            "MiniCPMO",
            {
                PipelineVariant.text: SglangVariant("text", shared_thinker_process=True),
                PipelineVariant.speech: SglangVariant(
                    "speech", ("talker", "code2wav"), shared_thinker_process=True
                ),
                PipelineVariant.duplex: SglangVariant("session", ("talker", "speech"), realtime=True),
            },
            vision_tp=False,
        ),
    },
}

VLLM_OMNI: dict[str, dict[Architecture, dict[PipelineVariant, VllmVariant]]] = {
    "0.30.0": {
        Architecture.qwen2_5_omni: {
            PipelineVariant.text: VllmVariant("qwen2_5_omni.yaml", "qwen2_5_omni_thinker_only", 1),
            PipelineVariant.speech: VllmVariant("qwen2_5_omni.yaml", "qwen2_5_omni", 3),
        },
        Architecture.qwen3_omni: {
            PipelineVariant.text: VllmVariant("qwen3_omni_moe.yaml", "qwen3_omni_moe_thinker_only", 1),
            PipelineVariant.speech: VllmVariant("qwen3_omni_moe.yaml", None, 3),
            # The release's Qwen3-Omni pipeline hands chunks thinker -> talker -> code2wav.
            PipelineVariant.streaming_speech: VllmVariant("qwen3_omni_moe.yaml", None, 3, async_chunk=True),
            PipelineVariant.duplex: VllmVariant("qwen3_omni_duplex.yaml", None, 3),
        },
        Architecture.minicpm_o: {
            PipelineVariant.speech: VllmVariant("minicpmo_4_5_turn.yaml", None, 3),
            PipelineVariant.duplex: VllmVariant("minicpmo_4_5.yaml", None, 3),
        },
        Architecture.ming_omni: {
            PipelineVariant.text: VllmVariant("ming_flash_omni_thinker_only.yaml", None, 1),
            PipelineVariant.speech: VllmVariant("ming_flash_omni.yaml", None, 2),
        },
    },
}

# Supported releases per peer runtime, newest last: an unset spec.runtime.version means the newest.
PEER_VERSIONS: dict[RuntimeType, tuple[str, ...]] = {
    RuntimeType.sglang_omni: tuple(SGLANG_OMNI),
    RuntimeType.vllm_omni: tuple(VLLM_OMNI),
}


def runtime_version(runtime: RuntimeType, version: str | None) -> str | None:
    """The release a peer runtime deployment runs: the spec's, else the newest supported."""
    if runtime is RuntimeType.builtin:
        return None
    return version if version is not None else PEER_VERSIONS[runtime][-1]


def peer_variants(
    runtime: RuntimeType, version: str, architecture: Architecture
) -> tuple[PipelineVariant, ...]:
    """The pipeline variants one release serves for one family, in the spec's order (empty: none)."""
    if runtime is RuntimeType.sglang_omni:
        family = SGLANG_OMNI.get(version, {}).get(architecture)
        served = set(family.variants) if family else set()
    else:
        served = set(VLLM_OMNI.get(version, {}).get(architecture, {}))
    return tuple(v for v in PipelineVariant if v in served)


def peer_families(runtime: RuntimeType, version: str) -> tuple[Architecture, ...]:
    table = SGLANG_OMNI.get(version, {}) if runtime is RuntimeType.sglang_omni else VLLM_OMNI.get(version, {})
    return tuple(a for a in Architecture if a in table)


# --- Peer-runtime worker pods: host resources and the startup window, from the parameter counts ---
#
# One sglang-omni / vllm-omni worker pod runs every stage. The checkpoint is read through host
# memory while it loads (bf16 safetensors: 2 bytes per parameter, whatever the serving precision),
# CPU offload keeps its gigabytes per thinker rank in host RAM, and each GPU process holds a CUDA
# context, pinned buffers and its share of /dev/shm (NCCL, the inter-stage connectors).
# spec.stages.thinker.resources.cpu / .memory override either default.
PEER_CHECKPOINT_BYTES_PER_PARAM = 2.0
PEER_HOST_BASE_GB = 16  # the API server, tokenizers, preprocessing and CPU stages
PEER_HOST_GB_PER_GPU = 8
PEER_CPU_BASE = 4
PEER_CPU_PER_GPU = 4
# Neither server answers /health with 200 before its engines are loaded (and, for sglang-omni,
# warmed up): 30 minutes for start-up and warm-up plus a minute per 10 GB of checkpoint to read.
PEER_STARTUP_BASE_S = 30 * 60
PEER_STARTUP_S_PER_GB = 6


@dataclass(frozen=True)
class PeerPodSize:
    cpu: str
    memory: str
    startup_s: int


def peer_pod_size(
    architecture: Architecture, *, gpus: int, cpu_offload_gb: int, tp: int
) -> PeerPodSize | None:
    """Default CPU and memory requests and startup window of a peer-runtime worker (None: unknown family)."""
    info = ARCHITECTURES.get(architecture)
    if info is None:
        return None
    checkpoint_gb = (
        info.thinker_params_billions + info.talker_params_billions
    ) * PEER_CHECKPOINT_BYTES_PER_PARAM
    memory_gb = (
        math.ceil(checkpoint_gb) + cpu_offload_gb * tp + PEER_HOST_BASE_GB + PEER_HOST_GB_PER_GPU * gpus
    )
    return PeerPodSize(
        cpu=str(PEER_CPU_BASE + PEER_CPU_PER_GPU * gpus),
        memory=f"{memory_gb}Gi",
        startup_s=PEER_STARTUP_BASE_S + math.ceil(checkpoint_gb) * PEER_STARTUP_S_PER_GB,
    )
