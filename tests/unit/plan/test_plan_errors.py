"""Every invalid spec gives exactly one error naming the field, the reason and the fix."""

from __future__ import annotations

import pytest
from spec_builders import deployment

from omni_operator.plan import PlanError, plan_deployment
from omni_operator.plan.rules import GpuAllocation, check_disjoint
from omni_operator.plan.types import Target

MING = {"model.name": "Ming-flash-omni-2.0", "runtime.type": "sglang-omni"}
CPU = {"gpu.tier": "cpu"}
TINY_FAMILY = (
    "spec.model.architecture: the builtin runtime writes tiny checkpoints for qwen2_5_omni and qwen3_omni only; "
    "use architecture: qwen2_5_omni or qwen3_omni (auto: qwen2_5_omni), or a real checkpoint source"
)

CASES = [
    pytest.param(
        {**MING, "stages.thinker.tensorParallelSize": 2},
        "spec.stages.thinker.tensorParallelSize: the ming_omni thinker does not fit: 103B params x 2 bytes/param "
        "(bf16) = 206.0 GB, / tensorParallelSize 2 = 103.0 GB per GPU > 0.80 x 80 GB = 64.0 GB usable on h100; "
        "set tensorParallelSize: 4 (51.5 GB per GPU)",
        id="ming-tp2-on-h100",
    ),
    pytest.param(
        {**MING, "stages.thinker.cpuOffloadGb": 10},
        "spec.stages.thinker.tensorParallelSize: the ming_omni thinker does not fit: 103B params x 2 bytes/param "
        "(bf16) = 206.0 GB, / tensorParallelSize 1 - cpuOffloadGb 10 = 196.0 GB per GPU > 0.80 x 80 GB = 64.0 GB "
        "usable on h100; set tensorParallelSize: 4 (41.5 GB per GPU)",
        id="offload-shown-in-arithmetic",
    ),
    pytest.param(
        {**MING, "stages.thinker.tensorParallelSize": 4, "gpu.tier": "a100-40gb"},
        "spec.stages.thinker.tensorParallelSize: the ming_omni thinker does not fit: 103B params x 2 bytes/param "
        "(bf16) = 206.0 GB, / tensorParallelSize 4 = 51.5 GB per GPU > 0.80 x 40 GB = 32.0 GB usable on a100-40gb; "
        "set tensorParallelSize: 8 (25.8 GB per GPU)",
        id="ming-tp4-on-a100-40gb",
    ),
    pytest.param(
        {"model.architecture": "qwen3_omni", "runtime.type": "sglang-omni", "stages.thinker.quantization": "fp8",
         "gpu.tier": "l40s", "stages.thinker.memFractionStatic": 0.3},
        "spec.stages.thinker.tensorParallelSize: the qwen3_omni thinker does not fit: 30.5B params x 1 byte/param "
        "(fp8) = 30.5 GB, / tensorParallelSize 1 = 30.5 GB per GPU > 0.30 x 48 GB = 14.4 GB usable on l40s; "
        "set tensorParallelSize: 4 (7.6 GB per GPU)",
        id="quantized-and-explicit-mem-fraction",
    ),
    pytest.param(
        {"model.thinkerParamsBillions": 70},
        "spec.stages.thinker.tensorParallelSize: the thinker does not fit: 70B params x 2 bytes/param (bf16) = "
        "140.0 GB, / tensorParallelSize 1 = 140.0 GB per GPU > 0.80 x 80 GB = 64.0 GB usable on h100; "
        "set tensorParallelSize: 4 (35.0 GB per GPU)",
        id="unknown-family-with-declared-size",
    ),
    pytest.param(
        {"model.thinkerParamsBillions": 5000, "gpu.gpusPerNode": 64, "stages.thinker.tensorParallelSize": 2},
        "spec.stages.thinker.tensorParallelSize: the thinker does not fit: 5000B params x 2 bytes/param (bf16) = "
        "10000.0 GB, / tensorParallelSize 2 = 5000.0 GB per GPU > 0.80 x 80 GB = 64.0 GB usable on h100; "
        "quantize (stages.thinker.quantization), offload (stages.thinker.cpuOffloadGb) or use a larger gpu.tier",
        id="nothing-fits",
    ),
    pytest.param(
        {"stages.imageEncoder.tensorParallelSize": 3, "stages.thinker.tensorParallelSize": 4},
        "spec.stages.imageEncoder.tensorParallelSize: must divide the vision encoder's 16 attention heads; "
        "use 1, 2, 4, 8 or 16",
        id="vision-tp-not-dividing-heads",
    ),
    pytest.param(
        {"stages.imageEncoder.tensorParallelSize": 4, "stages.thinker.tensorParallelSize": 2},
        "spec.stages.imageEncoder.tensorParallelSize: with placement withThinker the vision encoder shares the "
        "thinker's GPUs, so its tensorParallelSize cannot exceed stages.thinker.tensorParallelSize; lower it, or "
        "use placement: dedicated",
        id="vision-tp-above-thinker-when-sharing",
    ),
    pytest.param(
        {"pipeline": "text", "stages.talker.enabled": True},
        "spec.stages.talker.enabled: the text pipeline launches no talker; use pipeline: speech, or remove "
        "stages.talker.enabled",
        id="talker-with-text",
    ),
    pytest.param(
        {"pipeline": "streaming-speech", "stages.talker.enabled": False},
        "spec.stages.talker.enabled: the speech, streaming-speech and duplex pipelines need the talker; use "
        "pipeline: text, or remove stages.talker.enabled",
        id="speech-without-talker",
    ),
    pytest.param(
        {"model.source.type": "tiny", "runtime.type": "vllm-omni"},
        "spec.model.source.type: the tiny checkpoint is written by the builtin runtime only; use runtime.type: "
        "builtin, or a real checkpoint source (pvc, hostPath, image)",
        id="tiny-on-third-party",
    ),
    pytest.param(
        {"model.source.type": "tiny", "model.architecture": "minicpm_o"},
        TINY_FAMILY,
        id="tiny-of-a-family-without-one",
    ),
    pytest.param(
        {"model.source.type": "tiny", "model.name": "Ming-flash-omni-2.0"},
        TINY_FAMILY,
        id="tiny-of-a-family-named-by-the-model-name",
    ),
    pytest.param(
        {**CPU, "runtime.type": "sglang-omni"},
        "spec.runtime.type: only the builtin runtime runs on gpu.tier cpu; use runtime.type: builtin, or a GPU "
        "tier such as h100",
        id="cpu-third-party",
    ),
    pytest.param(
        {**CPU, "stages.thinker.tensorParallelSize": 2},
        "spec.stages.thinker.tensorParallelSize: gpu.tier cpu runs the thinker in one process; set "
        "tensorParallelSize: 1",
        id="cpu-thinker-tp",
    ),
    pytest.param(
        {**CPU, "stages.imageEncoder.tensorParallelSize": 2, "stages.thinker.tensorParallelSize": 1},
        "spec.stages.imageEncoder.tensorParallelSize: gpu.tier cpu runs the vision encoder in one process; set "
        "tensorParallelSize: 1",
        id="cpu-vision-tp",
    ),
    pytest.param(
        {**CPU, "stages.imageEncoder.placement": "dedicated"},
        "spec.stages.imageEncoder.placement: gpu.tier cpu runs every stage in one process, with no GPUs to "
        "dedicate; use placement: withThinker",
        id="cpu-dedicated-vision",
    ),
    # Peer runtimes: the support tables of the released versions (plan/catalogue.py).
    pytest.param(
        {"runtime.type": "sglang-omni", "model.architecture": "qwen3_omni", "pipeline": "duplex"},
        "spec.pipeline: sglang-omni 0.1.9 has no duplex pipeline for qwen3_omni; use pipeline: text or speech, or "
        "runtime.type: builtin or vllm-omni for duplex",
        id="sglang-qwen3-duplex",
    ),
    pytest.param(
        {"runtime.type": "sglang-omni", "model.architecture": "ming_omni", "pipeline": "duplex"},
        "spec.pipeline: sglang-omni 0.1.9 has no duplex pipeline for ming_omni; use pipeline: text, speech or "
        "streaming-speech",
        id="sglang-ming-duplex",
    ),
    pytest.param(
        {"runtime.type": "sglang-omni", "model.name": "Qwen2.5-Omni-7B"},
        "spec.model.architecture: sglang-omni 0.1.9 does not serve qwen2_5_omni; use runtime.type: builtin or "
        "vllm-omni",
        id="sglang-qwen25-detected-from-name",
    ),
    pytest.param(
        {"runtime.type": "sglang-omni", "model.architecture": "qwen3_omni", "stages.thinker.tensorParallelSize": 2,
         "stages.imageEncoder.tensorParallelSize": 2},
        "spec.stages.imageEncoder: sglang-omni 0.1.9 runs the qwen3_omni vision encoder with the thinker on one "
        "GPU; use placement: withThinker and tensorParallelSize: 1",
        id="sglang-qwen3-vision-tp",
    ),
    pytest.param(
        {"runtime.type": "sglang-omni"},
        "spec.model.architecture: sglang-omni needs the model family to pick its pipeline, and none was found in "
        "the model name or path; set model.architecture: qwen3_omni, ming_omni or minicpm_o",
        id="sglang-unknown-family",
    ),
    pytest.param(
        {"runtime.type": "sglang-omni", "runtime.version": "0.1.8", "model.architecture": "ming_omni"},
        "spec.runtime.version: sglang-omni supports release 0.1.9; use version: 0.1.9, or leave it unset for 0.1.9",
        id="sglang-unknown-version",
    ),
    pytest.param(
        {"runtime.version": "0.1.9"},
        "spec.runtime.version: the builtin runtime is versioned by runtime.image; remove runtime.version",
        id="builtin-version",
    ),
    pytest.param(
        {"runtime.type": "vllm-omni", "model.architecture": "ming_omni", "pipeline": "streaming-speech",
         "stages.thinker.tensorParallelSize": 4},
        "spec.pipeline: vllm-omni 0.30.0 has no streaming-speech pipeline for ming_omni; use pipeline: text or "
        "speech, or runtime.type: builtin or sglang-omni for streaming-speech",
        id="vllm-streaming",
    ),
    pytest.param(
        {"runtime.type": "vllm-omni", "model.architecture": "minicpm_o", "pipeline": "text"},
        "spec.pipeline: vllm-omni 0.30.0 has no text pipeline for minicpm_o; use pipeline: speech or duplex, or "
        "runtime.type: builtin or sglang-omni for text",
        id="vllm-minicpm-text",
    ),
    pytest.param(
        {"runtime.type": "vllm-omni", "model.path": "/models/Ming-flash-omni-2.0", "pipeline": "duplex",
         "stages.thinker.tensorParallelSize": 4},
        "spec.pipeline: vllm-omni 0.30.0 has no duplex pipeline for ming_omni; use pipeline: text or speech",
        id="vllm-ming-duplex-detected-from-path",
    ),
    pytest.param(
        {"runtime.type": "vllm-omni"},
        "spec.model.architecture: vllm-omni needs the model family to pick its pipeline, and none was found in the "
        "model name or path; set model.architecture: qwen2_5_omni, qwen3_omni, ming_omni or minicpm_o",
        id="vllm-unknown-family",
    ),
    pytest.param(
        {"runtime.type": "vllm-omni", "runtime.version": "0.29.0", "model.architecture": "qwen3_omni"},
        "spec.runtime.version: vllm-omni supports release 0.30.0; use version: 0.30.0, or leave it unset for 0.30.0",
        id="vllm-unknown-version",
    ),
    pytest.param(
        {"runtime.type": "vllm-omni", "model.architecture": "qwen2_5_omni", "stages.imageEncoder.placement": "dedicated"},
        "spec.stages.imageEncoder.placement: vllm-omni runs the vision encoder inside the thinker stage; use "
        "placement: withThinker",
        id="vllm-dedicated-vision",
    ),
    pytest.param(
        {"runtime.type": "vllm-omni", "model.architecture": "qwen2_5_omni", "stages.thinker.tensorParallelSize": 2,
         "stages.imageEncoder.tensorParallelSize": 2},
        "spec.stages.imageEncoder.tensorParallelSize: vllm-omni shards the vision encoder with the thinker; set "
        "imageEncoder.tensorParallelSize: 1",
        id="vllm-vision-tp",
    ),
    pytest.param(
        {"stages.thinker.quantization": "awq"},
        "spec.stages.thinker.quantization: the builtin runtime does not load quantized weights; remove "
        "quantization, or use runtime.type: sglang-omni or vllm-omni",
        id="builtin-quantization",
    ),
    pytest.param(
        {"stages.thinker.cpuOffloadGb": 8},
        "spec.stages.thinker.cpuOffloadGb: the builtin runtime does not offload weights to host memory; remove "
        "cpuOffloadGb, or use runtime.type: sglang-omni or vllm-omni",
        id="builtin-offload",
    ),
    pytest.param(
        {"model.name": "Ming-flash-omni-2.0", "pipeline": "duplex"},
        "spec.pipeline: the builtin runtime serves duplex for qwen2_5_omni, qwen3_omni or minicpm_o; use pipeline: "
        "streaming-speech, or one of those models",
        id="builtin-duplex-on-ming",
    ),
    pytest.param(
        {"stages.thinker.tensorParallelSize": 12, "gpu.gpusPerNode": 8, "gpu.tier": "h200"},
        "spec.stages.thinker.tensorParallelSize: 12 thinker ranks cannot be split evenly over nodes of 8 GPUs "
        "(gpu.gpusPerNode); use a multiple of 8",
        id="uneven-multi-node",
    ),
    pytest.param(
        {"runtime.type": "sglang-omni", "model.architecture": "ming_omni", "stages.thinker.tensorParallelSize": 8},
        "spec.gpu.gpusPerNode: sglang-omni runs a worker in one pod, which needs 9 GPUs, but a node has 8; lower "
        "the tensor-parallel sizes, or use runtime.type: builtin, whose thinker spans nodes",
        id="third-party-worker-larger-than-node",
    ),
    pytest.param(
        {"stages.thinker.tensorParallelSize": 16, "stages.imageEncoder.tensorParallelSize": 16},
        "spec.stages.imageEncoder.tensorParallelSize: vision ranks placed withThinker sit on the thinker leader's "
        "node of 8 GPUs; use at most 8, or placement: dedicated",
        id="vision-with-multi-node-thinker",
    ),
    pytest.param(
        {"stages.imageEncoder.tensorParallelSize": 16, "stages.imageEncoder.placement": "dedicated"},
        "spec.stages.imageEncoder.tensorParallelSize: 16 dedicated vision ranks do not fit one node of 8 GPUs; "
        "use at most 8",
        id="dedicated-vision-larger-than-node",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("settings", "message"), CASES)
def test_invalid_spec_message(settings: dict, message: str) -> None:
    with pytest.raises(PlanError) as caught:
        plan_deployment(deployment(**settings))
    assert str(caught.value) == message
    assert message.startswith(caught.value.field + ": ")


def test_a_pvc_source_plans_for_a_cluster_only() -> None:
    """`omni plan --target local` (and so `omni up`) refuses what only a cluster can mount."""
    pvc = deployment(**{"model.source.type": "pvc", "model.source.claimName": "models"})
    assert plan_deployment(pvc, target=Target.kubernetes).workers
    with pytest.raises(PlanError) as caught:
        plan_deployment(pvc, target=Target.local)
    assert str(caught.value) == (
        "spec.model.source.type: pvc names a PersistentVolumeClaim, which only a cluster has; under omni up "
        "use type hostPath with hostPath set to the checkpoint directory on this machine"
    )


def test_fit_check_passes_at_the_suggested_size() -> None:
    plan = plan_deployment(deployment(**{**MING, "stages.thinker.tensorParallelSize": 4}))
    assert plan.gpus_per_worker == 5


def test_tiny_and_unknown_families_skip_the_fit_check() -> None:
    # An unknown family with no declared size has nothing to check; the tiny checkpoint is tiny.
    assert plan_deployment(deployment(**{"model.name": "custom"})).architecture == "auto"
    # 30.5B in bf16 would not fit an A100 40 GB; the tiny Qwen3-Omni-MoE checkpoint does.
    tiny = {"model.name": "Qwen3-Omni-30B-A3B", "model.source.type": "tiny", "gpu.tier": "a100-40gb"}
    assert plan_deployment(deployment(**tiny)).architecture == "qwen3_omni"


def test_overlap_guard_names_the_gpu() -> None:
    with pytest.raises(PlanError) as caught:
        check_disjoint(
            GpuAllocation(thinker=(0, 1), talker=(1,), image_encoder=(0,), image_encoder_dedicated=False)
        )
    assert str(caught.value) == (
        "spec.stages.talker: talker GPU 1 overlaps the thinker's GPUs [0, 1]; give the talker the GPU after the "
        "thinker's ranks"
    )
    with pytest.raises(PlanError) as caught:
        check_disjoint(
            GpuAllocation(thinker=(0, 1), talker=(2,), image_encoder=(2, 3), image_encoder_dedicated=True)
        )
    assert str(caught.value) == (
        "spec.stages.imageEncoder.placement: dedicated vision GPUs [2] overlap the thinker's or talker's GPUs; "
        "give dedicated vision ranks the GPUs after the talker's"
    )
