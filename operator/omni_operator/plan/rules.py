"""Every placement rule and its error message, in one place.

The planner calls `check_spec` first, then `allocate_gpus` and `check_fit`. Each rule raises one
`PlanError` naming the camelCase field path, the reason and the fix. Messages without numbers in
them are static on purpose: crdgen copies them into CEL rules so the API server rejects the same
specs with the same words (see CEL_RULES).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from omni_operator.api.spec import (
    Architecture,
    GpuTier,
    ImageEncoderPlacement,
    OmniDeploymentSpec,
    PipelineVariant,
    RuntimeType,
    SourceType,
)
from omni_operator.plan.catalogue import (
    ARCHITECTURES,
    BYTES_PER_PARAM,
    PEER_VERSIONS,
    SGLANG_OMNI,
    TINY_FAMILIES,
    VISION_HEADS,
    peer_families,
    peer_variants,
)
from omni_operator.plan.types import PlanError


@dataclass(frozen=True)
class Rule:
    """A static error: the same words in the planner and in the CRD's CEL rules."""

    field: str
    reason: str
    fix: str

    def error(self) -> PlanError:
        return PlanError(self.field, self.reason, self.fix)

    @property
    def message(self) -> str:
        return str(self.error())


# Static errors, shared with the CRD's CEL rules (crdgen).
TINY_NEEDS_BUILTIN = Rule(
    "spec.model.source.type",
    "the tiny checkpoint is written by the builtin runtime only",
    "use runtime.type: builtin, or a real checkpoint source (pvc, hostPath, image)",
)
TINY_FAMILY = Rule(
    "spec.model.architecture",
    "the builtin runtime writes tiny checkpoints for qwen2_5_omni and qwen3_omni only",
    "use architecture: qwen2_5_omni or qwen3_omni (auto: qwen2_5_omni), or a real checkpoint source",
)
TINY_ARCHITECTURES = tuple(TINY_FAMILIES)
CPU_NEEDS_BUILTIN = Rule(
    "spec.runtime.type",
    "only the builtin runtime runs on gpu.tier cpu",
    "use runtime.type: builtin, or a GPU tier such as h100",
)
CPU_THINKER_TP = Rule(
    "spec.stages.thinker.tensorParallelSize",
    "gpu.tier cpu runs the thinker in one process",
    "set tensorParallelSize: 1",
)
CPU_VISION_TP = Rule(
    "spec.stages.imageEncoder.tensorParallelSize",
    "gpu.tier cpu runs the vision encoder in one process",
    "set tensorParallelSize: 1",
)
CPU_VISION_DEDICATED = Rule(
    "spec.stages.imageEncoder.placement",
    "gpu.tier cpu runs every stage in one process, with no GPUs to dedicate",
    "use placement: withThinker",
)
TEXT_WITH_TALKER = Rule(
    "spec.stages.talker.enabled",
    "the text pipeline launches no talker",
    "use pipeline: speech, or remove stages.talker.enabled",
)
SPEECH_WITHOUT_TALKER = Rule(
    "spec.stages.talker.enabled",
    "the speech, streaming-speech and duplex pipelines need the talker",
    "use pipeline: text, or remove stages.talker.enabled",
)
BUILTIN_NO_QUANTIZATION = Rule(
    "spec.stages.thinker.quantization",
    "the builtin runtime does not load quantized weights",
    "remove quantization, or use runtime.type: sglang-omni or vllm-omni",
)
SESSION_KV_NEEDS_BUILTIN = Rule(
    "spec.sessionKv.maxMib",
    "only the builtin runtime keeps a session's KV between turns",
    "remove sessionKv.maxMib, or use runtime.type: builtin",
)
BUILTIN_NO_OFFLOAD = Rule(
    "spec.stages.thinker.cpuOffloadGb",
    "the builtin runtime does not offload weights to host memory",
    "remove cpuOffloadGb, or use runtime.type: sglang-omni or vllm-omni",
)
VLLM_VISION_DEDICATED = Rule(
    "spec.stages.imageEncoder.placement",
    "vllm-omni runs the vision encoder inside the thinker stage",
    "use placement: withThinker",
)
VLLM_VISION_TP = Rule(
    "spec.stages.imageEncoder.tensorParallelSize",
    "vllm-omni shards the vision encoder with the thinker",
    "set imageEncoder.tensorParallelSize: 1",
)
VISION_TP_DIVIDES_HEADS = Rule(
    "spec.stages.imageEncoder.tensorParallelSize",
    f"must divide the vision encoder's {VISION_HEADS} attention heads",
    "use 1, 2, 4, 8 or 16",
)
VISION_TP_LE_THINKER = Rule(
    "spec.stages.imageEncoder.tensorParallelSize",
    "with placement withThinker the vision encoder shares the thinker's GPUs, so its tensorParallelSize "
    "cannot exceed stages.thinker.tensorParallelSize",
    "lower it, or use placement: dedicated",
)


def _names(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


DUPLEX_NEEDS_DUPLEX_MODEL = Rule(
    "spec.pipeline",
    "the builtin runtime serves duplex for "
    + _names([a.value for a, info in ARCHITECTURES.items() if PipelineVariant.duplex in info.pipelines]),
    "use pipeline: streaming-speech, or one of those models",
)


BUILTIN_NO_VERSION = Rule(
    "spec.runtime.version",
    "the builtin runtime is versioned by runtime.image",
    "remove runtime.version",
)


def version_rule(runtime: RuntimeType) -> Rule:
    versions = list(PEER_VERSIONS[runtime])
    return Rule(
        "spec.runtime.version",
        f"{runtime.value} supports release{'s' if len(versions) > 1 else ''} {_names(versions)}",
        f"use version: {_names(versions)}, or leave it unset for {versions[-1]}",
    )


def needs_architecture_rule(runtime: RuntimeType) -> Rule:
    families = [a.value for a in peer_families(runtime, PEER_VERSIONS[runtime][-1])]
    return Rule(
        "spec.model.architecture",
        f"{runtime.value} needs the model family to pick its pipeline, and none was found in the model name or path",
        f"set model.architecture: {_names(families)}",
    )


def _serving(architecture: Architecture, variant: PipelineVariant, other_than: RuntimeType) -> list[str]:
    """Runtimes (at their newest release) that serve this family with this variant."""
    served = []
    if variant in ARCHITECTURES[architecture].pipelines:
        served.append(RuntimeType.builtin.value)
    for runtime, versions in PEER_VERSIONS.items():
        if runtime is not other_than and variant in peer_variants(runtime, versions[-1], architecture):
            served.append(runtime.value)
    return served


def family_rule(runtime: RuntimeType, version: str, architecture: Architecture) -> Rule:
    others = _serving(architecture, PipelineVariant.speech, runtime)
    return Rule(
        "spec.model.architecture",
        f"{runtime.value} {version} does not serve {architecture.value}",
        f"use runtime.type: {_names(others)}",
    )


def variant_rule(
    runtime: RuntimeType, version: str, architecture: Architecture, variant: PipelineVariant
) -> Rule:
    served = [v.value for v in peer_variants(runtime, version, architecture)]
    others = _serving(architecture, variant, runtime)
    fix = f"use pipeline: {_names(served)}"
    if others:
        fix += f", or runtime.type: {_names(others)} for {variant.value}"
    return Rule(
        "spec.pipeline",
        f"{runtime.value} {version} has no {variant.value} pipeline for {architecture.value}",
        fix,
    )


def sglang_vision_rule(version: str, architecture: Architecture) -> Rule:
    return Rule(
        "spec.stages.imageEncoder",
        f"sglang-omni {version} runs the {architecture.value} vision encoder with the thinker on one GPU",
        "use placement: withThinker and tensorParallelSize: 1",
    )


def peer_refusals() -> list[tuple[RuntimeType, str, Architecture, PipelineVariant | None, Rule]]:
    """Every static refusal the support tables imply: (runtime, version, family, variant or None, rule).

    variant None: the release does not serve the family at all. crdgen turns each into a CEL rule.
    """
    found: list[tuple[RuntimeType, str, Architecture, PipelineVariant | None, Rule]] = []
    for runtime, versions in PEER_VERSIONS.items():
        for version in versions:
            served_families = peer_families(runtime, version)
            for architecture in ARCHITECTURES:
                if architecture not in served_families:
                    found.append(
                        (runtime, version, architecture, None, family_rule(runtime, version, architecture))
                    )
                    continue
                served = peer_variants(runtime, version, architecture)
                for variant in PipelineVariant:
                    if variant not in served:
                        rule = variant_rule(runtime, version, architecture, variant)
                        found.append((runtime, version, architecture, variant, rule))
    return found


def talker_enabled(spec: OmniDeploymentSpec) -> bool:
    enabled = spec.stages.talker.enabled
    return spec.pipeline is not PipelineVariant.text if enabled is None else enabled


def check_spec(spec: OmniDeploymentSpec, architecture: Architecture) -> None:
    """Every static rule, in a fixed order: the first broken one raises."""
    stages, runtime = spec.stages, spec.runtime.type
    vision = stages.image_encoder
    if spec.model.source.type is SourceType.tiny and runtime is not RuntimeType.builtin:
        raise TINY_NEEDS_BUILTIN.error()
    if spec.model.source.type is SourceType.tiny and architecture not in TINY_ARCHITECTURES:
        raise TINY_FAMILY.error()
    if spec.gpu.tier is GpuTier.cpu:
        if runtime is not RuntimeType.builtin:
            raise CPU_NEEDS_BUILTIN.error()
        if stages.thinker.tensor_parallel_size != 1:
            raise CPU_THINKER_TP.error()
        if vision.tensor_parallel_size != 1:
            raise CPU_VISION_TP.error()
        if vision.placement is ImageEncoderPlacement.dedicated:
            raise CPU_VISION_DEDICATED.error()
    if spec.pipeline is PipelineVariant.text and stages.talker.enabled is True:
        raise TEXT_WITH_TALKER.error()
    if spec.pipeline is not PipelineVariant.text and stages.talker.enabled is False:
        raise SPEECH_WITHOUT_TALKER.error()
    _check_runtime(spec, architecture)
    if VISION_HEADS % vision.tensor_parallel_size != 0:
        raise VISION_TP_DIVIDES_HEADS.error()
    if (
        vision.placement is ImageEncoderPlacement.with_thinker
        and vision.tensor_parallel_size > stages.thinker.tensor_parallel_size
    ):
        raise VISION_TP_LE_THINKER.error()


def _check_runtime(spec: OmniDeploymentSpec, architecture: Architecture) -> None:
    runtime, thinker, vision = spec.runtime.type, spec.stages.thinker, spec.stages.image_encoder
    if runtime is RuntimeType.builtin:
        if spec.runtime.version is not None:
            raise BUILTIN_NO_VERSION.error()
        known = ARCHITECTURES.get(architecture)
        if (
            spec.pipeline is PipelineVariant.duplex
            and known is not None
            and PipelineVariant.duplex not in known.pipelines
        ):
            raise DUPLEX_NEEDS_DUPLEX_MODEL.error()
        if thinker.quantization is not None:
            raise BUILTIN_NO_QUANTIZATION.error()
        if thinker.cpu_offload_gb:
            raise BUILTIN_NO_OFFLOAD.error()
        return
    if spec.session_kv.max_mib is not None:
        raise SESSION_KV_NEEDS_BUILTIN.error()
    version = spec.runtime.version or PEER_VERSIONS[runtime][-1]
    if version not in PEER_VERSIONS[runtime]:
        raise version_rule(runtime).error()
    if architecture is Architecture.auto:
        raise needs_architecture_rule(runtime).error()
    if architecture not in peer_families(runtime, version):
        raise family_rule(runtime, version, architecture).error()
    if spec.pipeline not in peer_variants(runtime, version, architecture):
        raise variant_rule(runtime, version, architecture, spec.pipeline).error()
    if runtime is RuntimeType.sglang_omni:
        dedicated = vision.placement is ImageEncoderPlacement.dedicated
        if not SGLANG_OMNI[version][architecture].vision_tp and (
            dedicated or vision.tensor_parallel_size != 1
        ):
            raise sglang_vision_rule(version, architecture).error()
    if runtime is RuntimeType.vllm_omni:
        if vision.placement is ImageEncoderPlacement.dedicated:
            raise VLLM_VISION_DEDICATED.error()
        if vision.tensor_parallel_size != 1:
            raise VLLM_VISION_TP.error()


@dataclass(frozen=True)
class GpuAllocation:
    """Worker-local logical GPU ids: thinker ranks first, then the talker, then dedicated vision."""

    thinker: tuple[int, ...]
    talker: tuple[int, ...]
    image_encoder: tuple[int, ...]
    image_encoder_dedicated: bool

    @property
    def total(self) -> int:
        return (
            len(self.thinker)
            + len(self.talker)
            + (len(self.image_encoder) if self.image_encoder_dedicated else 0)
        )


def allocate_gpus(spec: OmniDeploymentSpec) -> GpuAllocation:
    if spec.gpu.tier is GpuTier.cpu:
        return GpuAllocation((), (), (), False)
    thinker_tp = spec.stages.thinker.tensor_parallel_size
    thinker = tuple(range(thinker_tp))
    talker = (thinker_tp,) if talker_enabled(spec) else ()
    vision = spec.stages.image_encoder
    dedicated = vision.placement is ImageEncoderPlacement.dedicated
    start = thinker_tp + len(talker)
    image = (
        tuple(range(start, start + vision.tensor_parallel_size))
        if dedicated
        else thinker[: vision.tensor_parallel_size]
    )
    allocation = GpuAllocation(thinker, talker, image, dedicated)
    check_disjoint(allocation)
    return allocation


def check_disjoint(allocation: GpuAllocation) -> None:
    """Guard for the allocation order: a talker or dedicated vision rank never lands on a thinker GPU."""
    overlap = set(allocation.talker) & set(allocation.thinker)
    if overlap:
        raise PlanError(
            "spec.stages.talker",
            f"talker GPU {sorted(overlap)[0]} overlaps the thinker's GPUs {list(allocation.thinker)}",
            "give the talker the GPU after the thinker's ranks",
        )
    if allocation.image_encoder_dedicated:
        taken = set(allocation.thinker) | set(allocation.talker)
        overlap = set(allocation.image_encoder) & taken
        if overlap:
            raise PlanError(
                "spec.stages.imageEncoder.placement",
                f"dedicated vision GPUs {sorted(overlap)} overlap the thinker's or talker's GPUs",
                "give dedicated vision ranks the GPUs after the talker's",
            )


def check_local(spec: OmniDeploymentSpec) -> None:
    """What only a cluster has: a PersistentVolumeClaim source cannot be read on this machine."""
    if spec.model.source.type is SourceType.pvc:
        raise PlanError(
            "spec.model.source.type",
            "pvc names a PersistentVolumeClaim, which only a cluster has",
            "under omni up use type hostPath with hostPath set to the checkpoint directory on this machine",
        )


def check_nodes(spec: OmniDeploymentSpec, allocation: GpuAllocation) -> None:
    """Pods must fit a node: only the builtin thinker spans nodes, and only in whole nodes."""
    per_node = spec.gpu.gpus_per_node
    thinker_tp = len(allocation.thinker)
    if spec.runtime.type is not RuntimeType.builtin:
        if allocation.total > per_node:
            raise PlanError(
                "spec.gpu.gpusPerNode",
                f"{spec.runtime.type.value} runs a worker in one pod, which needs {allocation.total} GPUs, "
                f"but a node has {per_node}",
                "lower the tensor-parallel sizes, or use runtime.type: builtin, whose thinker spans nodes",
            )
        return
    if thinker_tp > per_node and thinker_tp % per_node != 0:
        raise PlanError(
            "spec.stages.thinker.tensorParallelSize",
            f"{thinker_tp} thinker ranks cannot be split evenly over nodes of {per_node} GPUs (gpu.gpusPerNode)",
            f"use a multiple of {per_node}",
        )
    if not allocation.image_encoder_dedicated and len(allocation.image_encoder) > per_node:
        raise PlanError(
            "spec.stages.imageEncoder.tensorParallelSize",
            f"vision ranks placed withThinker sit on the thinker leader's node of {per_node} GPUs",
            f"use at most {per_node}, or placement: dedicated",
        )
    if allocation.image_encoder_dedicated and len(allocation.image_encoder) > per_node:
        raise PlanError(
            "spec.stages.imageEncoder.tensorParallelSize",
            f"{len(allocation.image_encoder)} dedicated vision ranks do not fit one node of {per_node} GPUs",
            f"use at most {per_node}",
        )


def thinker_nodes(spec: OmniDeploymentSpec) -> int:
    return max(1, math.ceil(spec.stages.thinker.tensor_parallel_size / spec.gpu.gpus_per_node))


def check_fit(
    spec: OmniDeploymentSpec,
    *,
    architecture: Architecture,
    params_billions: float,
    memory_gb: float,
    mem_fraction: float,
) -> None:
    """The thinker's weights per GPU must fit the usable share of one GPU, arithmetic shown."""
    thinker = spec.stages.thinker
    per_param = BYTES_PER_PARAM[thinker.quantization]
    weights_gb = params_billions * per_param
    usable = mem_fraction * memory_gb

    def per_gpu(tp: int) -> float:
        return weights_gb / tp - thinker.cpu_offload_gb

    tp = thinker.tensor_parallel_size
    if per_gpu(tp) <= usable:
        return
    dtype = thinker.quantization.value if thinker.quantization else "bf16"
    name = f"{architecture.value} thinker" if architecture is not Architecture.auto else "thinker"
    unit = "byte/param" if per_param == 1 else "bytes/param"
    offload = f" - cpuOffloadGb {thinker.cpu_offload_gb}" if thinker.cpu_offload_gb else ""
    reason = (
        f"the {name} does not fit: {params_billions:g}B params x {per_param:g} {unit} ({dtype}) = "
        f"{weights_gb:.1f} GB, / tensorParallelSize {tp}{offload} = {per_gpu(tp):.1f} GB per GPU > "
        f"{mem_fraction:.2f} x {memory_gb:g} GB = {usable:.1f} GB usable on {spec.gpu.tier.value}"
    )
    fitting = [n for n in (1, 2, 4, 8, 16, 32, 64) if n > tp and per_gpu(n) <= usable]
    if fitting:
        fix = f"set tensorParallelSize: {fitting[0]} ({per_gpu(fitting[0]):.1f} GB per GPU)"
    else:
        fix = "quantize (stages.thinker.quantization), offload (stages.thinker.cpuOffloadGb) or use a larger gpu.tier"
    raise PlanError("spec.stages.thinker.tensorParallelSize", reason, fix)
