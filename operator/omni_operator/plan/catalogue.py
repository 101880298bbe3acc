"""What the planner knows about model families and GPU tiers.

Kept apart from the rules so adding a model or a GPU is a data change: parameter counts feed the
fit check, head counts feed the vision-TP rule, tier memory feeds both the fit check and the
memFractionStatic default. Sizes are the published checkpoints' thinker sizes (text model plus the
towers that sit with it), rounded to a tenth of a billion.
"""

from __future__ import annotations

from dataclasses import dataclass

from omni_operator.api.spec import Architecture, GpuTier, ModelSpec, PipelineVariant, Quantization

VISION_HEADS = 16  # every supported family's vision tower has 16 attention heads


@dataclass(frozen=True)
class ArchitectureInfo:
    thinker_params_billions: float
    talker_params_billions: float
    vision_heads: int
    pipelines: frozenset[PipelineVariant]
    vllm_model_arch: str | None  # the class vLLM-Omni's stage config names, None when unsupported
    vllm_talker_config: str  # hf_config_name vLLM-Omni uses for the talker/code2wav stages


_SPEECH = frozenset({PipelineVariant.text, PipelineVariant.speech, PipelineVariant.streaming_speech})

ARCHITECTURES: dict[Architecture, ArchitectureInfo] = {
    Architecture.qwen2_5_omni: ArchitectureInfo(
        7.6, 0.7, VISION_HEADS, _SPEECH, "Qwen2_5OmniForConditionalGeneration", "talker_config"
    ),
    Architecture.qwen3_omni: ArchitectureInfo(
        30.5, 3.0, VISION_HEADS, _SPEECH, "Qwen3OmniMoeForConditionalGeneration", "talker_config"
    ),
    # Ming-flash-omni: a 100B-class MoE thinker; the field runs it at TP4 on 80 GB parts.
    Architecture.ming_omni: ArchitectureInfo(103.0, 0.5, VISION_HEADS, _SPEECH, None, "talker_config"),
    Architecture.minicpm_o: ArchitectureInfo(
        8.2,
        0.5,
        VISION_HEADS,
        _SPEECH | {PipelineVariant.duplex},
        "MiniCPMO4_5ForConditionalGeneration",
        "tts_config",
    ),
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
