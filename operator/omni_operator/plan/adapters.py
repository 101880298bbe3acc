"""Runtime adapters: the real command lines (and config files) of each serving runtime.

The planner decides placement once; these functions only spell it in each runtime's flags. GPU
ids here are always pod-local (0..n-1 of the devices the process sees). The builtin flags follow
the contract in the project notes (`omni serve`, `omni stage`); sglang-omni and vllm-omni follow
the released versions' own CLIs and deploy-config format (catalogue.SGLANG_OMNI / VLLM_OMNI name
what each release serves; tests/unit/peers checks the output with the releases' own parsers).
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from omni_operator.api.spec import (
    Architecture,
    LoadFormat,
    OmniDeploymentSpec,
    RuntimeType,
    SourceType,
)
from omni_operator.api.streaming_input import streaming_input_flags
from omni_operator.plan.catalogue import SGLANG_OMNI, TINY_FAMILIES, VLLM_OMNI
from omni_operator.plan.types import Stage

VLLM_DEPLOY_CONFIG = "deploy_config.yaml"


@dataclass(frozen=True)
class ProcessContext:
    """What every process of one worker shares: who it is and how it binds."""

    worker: str
    revision: str
    host: str | None  # None: the runtime's default (0.0.0.0), as in pods
    model_path: str  # the checkpoint directory as the processes see it (layout.process_model_path)
    architecture: Architecture = Architecture.auto  # resolved; picks the tiny checkpoint's family


def gpu_list(ids: tuple[int, ...] | list[int]) -> str:
    return ",".join(str(i) for i in ids)


def _model_flags(spec: OmniDeploymentSpec, ctx: ProcessContext) -> list[str]:
    # The tiny source omits --model-path: the builtin runtime then writes the family's tiny
    # checkpoint once (Qwen2.5-Omni's unless --tiny-family says otherwise). A real checkpoint's
    # config.json names its family, so no flag says it.
    if spec.model.source.type is SourceType.tiny:
        family = TINY_FAMILIES[ctx.architecture]
        flags = [] if family == TINY_FAMILIES[Architecture.auto] else ["--tiny-family", family]
    else:
        flags = ["--model-path", ctx.model_path]
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
    argv = [
        "omni",
        "serve",
        *_model_flags(spec, ctx),
        *_bind(ctx, port),
        "--device",
        "cpu",
        *_identity(ctx),
    ]
    for stage, address in remote.items():
        argv += ["--remote-stage", f"{stage.value}={address}"]
    return (
        *argv,
        *_media_flags(spec),
        *streaming_input_flags(spec.streaming_input),
        *_speech_flags(spec),
        *([] if Stage.thinker in remote else session_kv_flags(spec)),
        *spec.runtime.extra_args,
    )


def _speech_flags(spec: OmniDeploymentSpec) -> list[str]:
    """spec.speech as `omni serve` flags: the worker API process admits speech streams."""
    limit = spec.speech.max_streams
    return [] if limit is None else ["--max-speech-streams", str(limit)]


def session_kv_flags(spec: OmniDeploymentSpec) -> list[str]:
    """spec.sessionKv as flags of the process that runs the thinker (its scheduler keeps the KV)."""
    size = spec.session_kv.max_mib
    return [] if size is None else ["--session-kv-mb", str(size)]


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
        *_model_flags(spec, ctx),
        *_bind(ctx, port),
        "--device",
        "cuda",
        *placement,
        *_identity(ctx),
        *(session_kv_flags(spec) if Stage.thinker in stages else []),
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
    version: str,
    model_path: str,
    architecture: Architecture,
    host: str,
    port: int,
    thinker: tuple[int, ...],
    talker: tuple[int, ...],
    vision: tuple[int, ...],
    vision_dedicated: bool,
    mem_fraction: float,
) -> tuple[str, ...]:
    """`sgl-omni serve` (0.1.9): one process holding the whole worker, GPUs by logical id.

    Placement is written as the release's dotted per-stage options (`--thinker.tp_size 4
    --thinker.gpu [0,1,2,3] --talker.gpu 4`), GPU lists as JSON lists, stage names as the
    family's config names them (catalogue.SGLANG_OMNI); the variant picks the stage graph.
    """
    family = SGLANG_OMNI[version][architecture]
    variant = family.variants[spec.pipeline]
    thinker_spec = spec.stages.thinker
    argv = ["sgl-omni", "serve", "--model-path", model_path, "--model-name", spec.model.name]
    # The server binds 0.0.0.0 by default; spelled out so local mode can bind 127.0.0.1.
    argv += ["--host", host, "--port", str(port), "--variant", variant.name]
    if variant.realtime:
        argv.append("--enable-realtime")
    argv += ["--thinker.tp_size", str(len(thinker)), "--thinker.gpu", _json_gpus(thinker)]
    if variant.shared_thinker_process and len(thinker) > 1:
        argv += ["--thinker.process", "thinker"]
    for stage in variant.talker_stages:
        argv += [f"--{stage}.gpu", str(talker[0])]
    # The vision encoder defaults to GPU 0 with the thinker; spell it out only when it differs.
    if family.vision_tp and (vision_dedicated or len(vision) > 1):
        argv += ["--image_encoder.tp_size", str(len(vision)), "--image_encoder.gpu", _json_gpus(vision)]
    argv += ["--thinker.engine.mem_fraction_static", f"{mem_fraction:g}"]
    if thinker_spec.cpu_offload_gb:
        argv += ["--thinker.engine.cpu_offload_gb", str(thinker_spec.cpu_offload_gb)]
    if thinker_spec.quantization is not None:
        argv += ["--thinker.engine.quantization", thinker_spec.quantization.value]
    if spec.model.load_format is LoadFormat.dummy:
        argv += ["--thinker.engine.load_format", "dummy"]
    return (*argv, *_third_party_extra(spec))


def _json_gpus(ids: tuple[int, ...]) -> str:
    return "[" + ",".join(str(i) for i in ids) + "]"


# vllm-omni reads --deploy-config with OmegaConf, which resolves ${oc.env:...}; the overlay's
# base_config names the release's shipped per-model file through this variable, which the
# container's first step sets to the installed package's deploy directory.
VLLM_DEPLOY_DIR_ENV = "OMNI_VLLM_OMNI_DEPLOY_DIR"
VLLM_PRELUDE = (
    f'export {VLLM_DEPLOY_DIR_ENV}="$(python3 -c '
    "'import importlib.util as u; print(u.find_spec(\"vllm_omni\").submodule_search_locations[0])'"
    ')/deploy" && exec "$0" "$@"'
)


def vllm_serve(
    spec: OmniDeploymentSpec, *, model_path: str, host: str | None, port: int, deploy_config_path: str
) -> tuple[str, ...]:
    """`vllm-omni serve MODEL --omni` (0.30.0): placement lives in the deploy config, not in flags.

    The command starts with a one-line shell step (VLLM_PRELUDE) that points the deploy
    config's base_config at the image's own vllm_omni/deploy directory, then execs vllm-omni.
    """
    argv = ["vllm-omni", "serve", model_path, "--omni"]
    argv += (["--host", host] if host else []) + ["--port", str(port)]
    argv += ["--served-model-name", spec.model.name, "--deploy-config", deploy_config_path]
    return ("sh", "-c", VLLM_PRELUDE, *argv, *_third_party_extra(spec))


def _third_party_extra(spec: OmniDeploymentSpec) -> list[str]:
    return [*spec.runtime.extra_args, *spec.stages.thinker.args, *spec.stages.talker.args]


def vllm_deploy_config(
    spec: OmniDeploymentSpec,
    *,
    version: str,
    deployment: str,
    architecture: Architecture,
    thinker: tuple[int, ...],
    talker: tuple[int, ...],
    mem_fraction: float,
) -> str:
    """vllm-omni's deploy config: an overlay on the release's shipped per-model file.

    `base_config` layers it on vllm_omni/deploy/<file> (so connectors, sampling defaults and
    platform sections stay the release's); the overlay writes only what the plan decides: each
    stage's devices (pod-local ids), the thinker's tensor parallelism and memory fraction, the
    pipeline for thinker-only variants, the session mode, chunked streaming for streaming-speech,
    and the engine options from the spec.
    """
    variant = VLLM_OMNI[version][architecture][spec.pipeline]
    thinker_spec = spec.stages.thinker
    config: dict[str, object] = {"base_config": f"${{oc.env:{VLLM_DEPLOY_DIR_ENV}}}/{variant.deploy_file}"}
    if variant.pipeline is not None:
        config["pipeline"] = variant.pipeline
    if variant.session_mode is not None:
        config["session_mode"] = variant.session_mode
    if variant.async_chunk is not None:
        config["async_chunk"] = variant.async_chunk
    if spec.model.trust_remote_code:
        config["trust_remote_code"] = True
    thinker_stage: dict[str, object] = {
        "stage_id": 0,
        "devices": gpu_list(thinker),
        "tensor_parallel_size": len(thinker),
        "gpu_memory_utilization": mem_fraction,
    }
    if thinker_spec.quantization is not None:
        thinker_stage["quantization"] = thinker_spec.quantization.value
    if thinker_spec.cpu_offload_gb:
        thinker_stage["cpu_offload_gb"] = thinker_spec.cpu_offload_gb
    stages = [thinker_stage]
    # The talker and its vocoder share the talker GPU, at the shipped memory fractions.
    stages += [{"stage_id": i, "devices": gpu_list(talker)} for i in range(1, variant.stages)]
    if spec.model.load_format is LoadFormat.dummy:
        for stage in stages:
            stage["load_format"] = "dummy"
    config["stages"] = stages
    header = (
        f"# vllm-omni {version} deploy config for {deployment} ({architecture.value}, pipeline "
        f"{spec.pipeline.value}),\n# generated by the omni planner: an overlay on the release's "
        f"{variant.deploy_file}. Devices are pod-local GPU ids: thinker ranks first, then the talker.\n"
    )
    return header + yaml.safe_dump(config, sort_keys=False)


def router_image(spec: OmniDeploymentSpec, default_image: str) -> str:
    """The router is always `omni router`: third-party runtimes' images do not have it."""
    if "router" in spec.runtime.stage_images:
        return spec.runtime.stage_images["router"]
    return spec.runtime.image if spec.runtime.type is RuntimeType.builtin else default_image
