"""Runtime adapters: the real command lines (and config files) of each serving runtime.

The planner decides placement once; these functions only spell it in each runtime's flags. GPU
ids here are always pod-local (0..n-1 of the devices the process sees). The builtin flags follow
the contract in the project notes (`omni serve`, `omni stage`); sglang-omni and vllm-omni follow
their published launch flags and stage-config format.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from omni_operator.api.spec import (
    Architecture,
    LoadFormat,
    OmniDeploymentSpec,
    PipelineVariant,
    RuntimeType,
    SourceType,
)
from omni_operator.plan.catalogue import ARCHITECTURES
from omni_operator.plan.types import Stage

VLLM_STAGE_CONFIG = "stage_configs.yaml"

# vLLM-Omni's per-family input processors between stages (module under stage_input_processors).
_VLLM_PROCESSORS: dict[Architecture, tuple[str, bool]] = {
    # family -> (module, has a talker2code2wav processor)
    Architecture.qwen2_5_omni: ("qwen2_5_omni", False),
    Architecture.qwen3_omni: ("qwen3_omni", True),
    Architecture.minicpm_o: ("minicpmo4_5", True),
}
_VLLM_PROCESSOR_PACKAGE = "vllm_omni.model_executor.stage_input_processors"


@dataclass(frozen=True)
class ProcessContext:
    """What every process of one worker shares: who it is and how it binds."""

    worker: str
    revision: str
    host: str | None  # None: the runtime's default (0.0.0.0), as in pods


def gpu_list(ids: tuple[int, ...] | list[int]) -> str:
    return ",".join(str(i) for i in ids)


def _model_flags(spec: OmniDeploymentSpec) -> list[str]:
    # The tiny source omits --model-path: the builtin runtime then writes the tiny checkpoint once.
    flags = [] if spec.model.source.type is SourceType.tiny else ["--model-path", spec.model.path]
    flags += ["--model-name", spec.model.name, "--pipeline", spec.pipeline.value]
    if spec.model.load_format is LoadFormat.dummy:
        flags += ["--load-format", "dummy"]
    return flags


def _bind(ctx: ProcessContext, port: int) -> list[str]:
    return (["--host", ctx.host] if ctx.host else []) + ["--port", str(port)]


def _identity(ctx: ProcessContext) -> list[str]:
    return ["--worker-id", ctx.worker, "--revision", ctx.revision]


def builtin_serve(
    spec: OmniDeploymentSpec, ctx: ProcessContext, *, port: int, remote: dict[Stage, str]
) -> tuple[str, ...]:
    """`omni serve`: the worker API; with `remote`, the named stages run behind stage links."""
    argv = ["omni", "serve", *_model_flags(spec), *_bind(ctx, port), "--device", "cpu", *_identity(ctx)]
    for stage, address in remote.items():
        argv += ["--remote-stage", f"{stage.value}={address}"]
    return (*argv, *_media_flags(spec), *spec.runtime.extra_args)


def _media_flags(spec: OmniDeploymentSpec) -> list[str]:
    """spec.media as `omni serve` flags: the worker API process is the one that fetches media URLs."""
    flags: list[str] = []
    for domain in spec.media.allowed_domains:
        flags += ["--allowed-media-domain", domain]
    if spec.media.allow_private_addresses:
        flags.append("--allow-private-media-addresses")
    for cidr in spec.media.denied_networks:
        flags += ["--deny-media-network", cidr]
    return flags


def builtin_stage(
    spec: OmniDeploymentSpec,
    ctx: ProcessContext,
    *,
    stages: tuple[Stage, ...],
    port: int,
    placement: list[str],
    extra: list[str],
) -> tuple[str, ...]:
    """`omni stage`: some stages served over a stage link, with their pod-local GPU placement."""
    argv = [
        "omni",
        "stage",
        "--stages",
        ",".join(s.value for s in stages),
        *_model_flags(spec),
        *_bind(ctx, port),
        "--device",
        "cuda",
        *placement,
        *_identity(ctx),
    ]
    return (*argv, *spec.runtime.extra_args, *extra)


def thinker_placement(
    *, tp: int, local_gpus: tuple[int, ...], vision_tp: int | None, mem_fraction: float
) -> list[str]:
    flags = ["--thinker-tp-size", str(tp), "--thinker-gpus", gpu_list(local_gpus)]
    if vision_tp is not None:
        flags += [
            "--image-encoder-tp-size",
            str(vision_tp),
            "--image-encoder-gpus",
            gpu_list(local_gpus[:vision_tp]),
        ]
    return [*flags, "--mem-fraction-static", f"{mem_fraction:g}"]


def sglang_serve(
    spec: OmniDeploymentSpec,
    *,
    host: str,
    port: int,
    thinker: tuple[int, ...],
    talker: tuple[int, ...],
    vision: tuple[int, ...],
    vision_dedicated: bool,
    mem_fraction: float,
) -> tuple[str, ...]:
    """`sgl-omni serve`: one process holding the whole worker, GPUs by logical id."""
    thinker_spec = spec.stages.thinker
    argv = ["sgl-omni", "serve", "--model-path", spec.model.path, "--model-name", spec.model.name]
    # sglang servers bind 127.0.0.1 unless told otherwise, which a Service cannot reach.
    argv += ["--host", host, "--port", str(port)]
    if spec.pipeline is PipelineVariant.text:
        argv.append("--text-only")
    argv += ["--thinker-tp-size", str(len(thinker)), "--thinker-gpus", gpu_list(thinker)]
    if talker:
        argv += ["--talker-gpu", str(talker[0])]
    # The vision encoder defaults to GPU 0 with the thinker; spell it out only when it differs.
    if vision_dedicated or len(vision) > 1:
        argv += ["--image-encoder-tp-size", str(len(vision)), "--image-encoder-gpus", gpu_list(vision)]
    argv += ["--mem-fraction-static", f"{mem_fraction:g}"]
    if thinker_spec.cpu_offload_gb:
        argv += ["--cpu-offload-gb", str(thinker_spec.cpu_offload_gb)]
    if thinker_spec.quantization is not None:
        argv += ["--quantization", thinker_spec.quantization.value]
    if spec.model.load_format is LoadFormat.dummy:
        argv += ["--load-format", "dummy"]
    if spec.model.trust_remote_code:
        argv.append("--trust-remote-code")
    return (*argv, *_third_party_extra(spec))


def vllm_serve(
    spec: OmniDeploymentSpec, *, host: str | None, port: int, stage_config_path: str
) -> tuple[str, ...]:
    """`vllm serve --omni`: placement lives in the stage config file, not in flags."""
    argv = ["vllm", "serve", spec.model.path, "--omni"]
    argv += (["--host", host] if host else []) + ["--port", str(port)]
    argv += ["--served-model-name", spec.model.name, "--stage-configs-path", stage_config_path]
    if spec.model.trust_remote_code:
        argv.append("--trust-remote-code")
    return (*argv, *_third_party_extra(spec))


def _third_party_extra(spec: OmniDeploymentSpec) -> list[str]:
    return [*spec.runtime.extra_args, *spec.stages.thinker.args, *spec.stages.talker.args]


def vllm_stage_config(
    spec: OmniDeploymentSpec,
    *,
    deployment: str,
    architecture: Architecture,
    thinker: tuple[int, ...],
    talker: tuple[int, ...],
    mem_fraction: float,
) -> str:
    """vLLM-Omni's stage config (stage_args: thinker, then talker and code2wav for speech).

    Format as in vllm_omni/model_executor/stage_configs/*.yaml: each stage has runtime.devices
    (pod-local ids), engine_args for its engine, engine_input_source naming upstream stage ids, and
    final_output/final_output_type on stages whose output reaches the client.
    """
    model_arch = ARCHITECTURES[architecture].vllm_model_arch
    talker_config = ARCHITECTURES[architecture].vllm_talker_config
    module, has_code2wav_processor = _VLLM_PROCESSORS[architecture]
    speech = spec.pipeline is PipelineVariant.speech
    thinker_spec = spec.stages.thinker
    thinker_args: dict[str, object] = {
        "model_stage": "thinker",
        "model_arch": model_arch,
        "tensor_parallel_size": len(thinker),
        "gpu_memory_utilization": mem_fraction,
        "trust_remote_code": spec.model.trust_remote_code,
        "engine_output_type": "latent" if speech else "text",
        "hf_config_name": "thinker_config",
        "distributed_executor_backend": "mp",
    }
    if thinker_spec.quantization is not None:
        thinker_args["quantization"] = thinker_spec.quantization.value
    if thinker_spec.cpu_offload_gb:
        thinker_args["cpu_offload_gb"] = thinker_spec.cpu_offload_gb
    if spec.model.load_format is LoadFormat.dummy:
        thinker_args["load_format"] = "dummy"
    stage_args: list[dict[str, object]] = [
        {
            "stage_id": 0,
            "runtime": {"devices": gpu_list(thinker)},
            "engine_args": thinker_args,
            "is_comprehension": True,
            "final_output": True,
            "final_output_type": "text",
        }
    ]
    if speech:
        common = {"model_arch": model_arch, "trust_remote_code": spec.model.trust_remote_code}
        common |= {"hf_config_name": talker_config, "distributed_executor_backend": "mp"}
        if spec.model.load_format is LoadFormat.dummy:
            common["load_format"] = "dummy"
        talker_stage: dict[str, object] = {
            "stage_id": 1,
            "runtime": {"devices": gpu_list(talker)},
            # talker and code2wav share the talker GPU: 0.6 + 0.1 of it.
            "engine_args": {
                "model_stage": "talker",
                **common,
                "gpu_memory_utilization": 0.6,
                "engine_output_type": "latent",
            },
            "engine_input_source": [0],
            "custom_process_input_func": f"{_VLLM_PROCESSOR_PACKAGE}.{module}.thinker2talker",
        }
        code2wav_stage: dict[str, object] = {
            "stage_id": 2,
            "runtime": {"devices": gpu_list(talker)},
            "engine_args": {
                "model_stage": "code2wav",
                **common,
                "gpu_memory_utilization": 0.1,
                "engine_output_type": "audio",
            },
            "engine_input_source": [1],
            "final_output": True,
            "final_output_type": "audio",
        }
        if has_code2wav_processor:
            code2wav_stage["custom_process_input_func"] = (
                f"{_VLLM_PROCESSOR_PACKAGE}.{module}.talker2code2wav"
            )
        stage_args += [talker_stage, code2wav_stage]
    header = (
        f"# vLLM-Omni stage config for {deployment} ({architecture.value}, pipeline {spec.pipeline.value}),\n"
        "# generated by the omni planner. Devices are pod-local GPU ids: thinker ranks first, then the talker.\n"
    )
    return header + yaml.safe_dump({"stage_args": stage_args}, sort_keys=False)


def router_image(spec: OmniDeploymentSpec, default_image: str) -> str:
    """The router is always `omni router`: third-party runtimes' images do not have it."""
    if "router" in spec.runtime.stage_images:
        return spec.runtime.stage_images["router"]
    return spec.runtime.image if spec.runtime.type is RuntimeType.builtin else default_image
