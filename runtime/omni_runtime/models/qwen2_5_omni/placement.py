"""Where each module lives (from the device and GPU flags), what a stage process loaded, and the
CUDA stream each stage thread runs on (both families)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omni_runtime.contract import switches
from omni_runtime.contract.engine import EngineError
from omni_runtime.contract.options import EngineOptions

log = logging.getLogger(__name__)


@dataclass
class Placement:
    dtype: torch.dtype
    thinker: torch.device  # text model, lm_head, token embeddings (mm_aggregate)
    audio: torch.device
    vision: torch.device
    talker: torch.device  # talker and token2wav
    cuda_graphs: bool


@dataclass
class LoadedModel:
    """The modules of the hosted stages; None where another process hosts the stage."""

    config: Any
    processor: Any
    eos_token_ids: tuple[int, ...]
    speakers: dict[str, dict[str, Any]]
    placement: Placement
    path: Path | None
    rope: Any  # RopeIndex over the thinker config
    text: Any = None  # Qwen2_5OmniThinkerTextModel (embed_tokens, layers, norm, rotary_emb)
    embed: Any = None  # the thinker's token embedding table
    lm_head: Any = None
    audio_tower: Any = None
    visual: Any = None
    talker: Any = None
    token2wav: Any = None
    text_vectors: dict[int, Any] = field(default_factory=dict)
    load_seconds: float = 0.0
    # Thinker tensor parallelism: this process's rank, the group size, and (rank 0 only) the
    # tp_group.TPLeader that drives the follower processes.
    tp_rank: int = 0
    tp_world: int = 1
    tp: Any = None
    # Image-encoder tensor parallelism: the group size, and (rank 0 of a dedicated image-encoder
    # process) the leader, or (a process hosting the encoder next to other stages) the
    # vision_stage.VisionStageChild that runs the encoder; ``visual`` is None then.
    vision_tp_world: int = 1
    vision_tp: Any = None
    vision_stage: Any = None


def _dtype(name: str, *, default: torch.dtype) -> torch.dtype:
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name == "auto":
        return default
    if name not in table:
        raise EngineError(f"unknown dtype {name!r}; use auto, float32, bfloat16 or float16", param="dtype")
    return table[name]


def resolve_placement(options: EngineOptions, *, tp_rank: int = 0, vision_rank: int = 0) -> Placement:
    """Map device/dtype/GPU flags to torch devices; impossible requests become EngineError.

    ``tp_rank`` picks this process's thinker GPU from --thinker-gpus (default: GPU ``tp_rank``);
    ``vision_rank`` its image-encoder GPU from --image-encoder-gpus (under image-encoder TP the
    default is GPU ``vision_rank``; without it, the thinker's GPU).
    """
    has_cuda = torch.cuda.is_available()
    if options.device == "cuda" and not has_cuda:
        raise EngineError(
            "device=cuda was asked but no CUDA GPU is visible; use --device cpu or auto", param="device"
        )
    if not (has_cuda and options.device in ("auto", "cuda")):
        if options.thinker_gpus or options.talker_gpu is not None or options.image_encoder_gpus:
            log.warning("GPU placement flags ignored: running on the CPU")
        cpu = torch.device("cpu")
        return Placement(_dtype(options.dtype, default=torch.float32), cpu, cpu, cpu, cpu, cuda_graphs=False)
    count = torch.cuda.device_count()
    choose_attention_kernels()

    def gpu(index: int, flag: str) -> torch.device:
        if not 0 <= index < count:
            raise EngineError(f"{flag} names GPU {index} but this process sees {count} GPU(s)", param=flag)
        return torch.device("cuda", index)

    tp = options.thinker_tp_size
    if tp > count:
        raise EngineError(
            f"--thinker-tp-size {tp} needs {tp} GPUs but this process sees {count}; lower it or expose more GPUs",
            param="thinker_tp_size",
        )
    vision_tp = options.image_encoder_tp_size
    if vision_tp > count:
        raise EngineError(
            f"--image-encoder-tp-size {vision_tp} needs {vision_tp} GPUs but this process sees {count}; lower it "
            "or expose more GPUs",
            param="image_encoder_tp_size",
        )
    thinker_index = options.thinker_gpus[tp_rank] if options.thinker_gpus else tp_rank
    thinker = gpu(thinker_index, "thinker_gpus")
    if options.image_encoder_gpus:
        vision = gpu(options.image_encoder_gpus[vision_rank], "image_encoder_gpus")
    else:
        vision = gpu(vision_rank, "image_encoder_gpus") if vision_tp > 1 else thinker
    talker = gpu(options.talker_gpu, "talker_gpu") if options.talker_gpu is not None else thinker
    dtype = _dtype(options.dtype, default=torch.bfloat16)
    return Placement(dtype, thinker, thinker, vision, talker, cuda_graphs=True)


def choose_attention_kernels(keep_cudnn: bool | None = None) -> bool:
    """Take cuDNN's fused attention out of ``scaled_dot_product_attention`` for this process
    (flash and memory-efficient attention remain); returns whether cuDNN's stays.

    cuDNN builds an execution plan for every new (rows, query length, key length) it meets, and
    a prompt's length is new nearly every time: on an H100 that was 1.4 ms of CPU per layer, 40
    ms per prefill of a Qwen2.5-Omni thinker or talker, paid by most requests on their way to
    the first token and the first audio (tests/gpu/cold_prefill.py). The flash and
    memory-efficient kernels have no per-shape set-up. ``OMNI_CUDNN_ATTENTION=1`` keeps cuDNN's,
    to measure. Process-wide, and set before anything is compiled: a compiled graph keeps the
    kernel it was traced with.
    """
    if keep_cudnn is None:
        keep_cudnn = switches.flag("OMNI_CUDNN_ATTENTION")
    torch.backends.cuda.enable_cudnn_sdp(keep_cudnn)
    return keep_cudnn


STREAM_PRIORITIES = {"talker": -2, "vocoder": -1}  # lower is served first; unnamed stages 0


def stream_priorities(text: str | None = None) -> dict[str, int]:
    """Each stage's CUDA stream priority: ``STREAM_PRIORITIES``, or ``OMNI_STREAM_PRIORITIES``
    (``thinker=-2,talker=-1``: the named stages' values, the others 0) to measure another order.
    A wrong value raises ValueError in the switch's words (contract.switches)."""
    name = "OMNI_STREAM_PRIORITIES"
    parsed = switches.read(name) if text is None else switches.parse(name, text)
    return dict(STREAM_PRIORITIES) if parsed is None else parsed


def stage_stream_initializer(placement: Placement, stage: str) -> Any:
    """A CUDA stream per stage thread, so stages on one GPU overlap instead of queueing (both
    families' ``thread_initializer``).

    Every stage function synchronises its stream before handing tensors to another stage and
    keeps its inputs referenced until then, so no stream reads a tensor another stream is
    still writing or has freed.
    """
    device = {
        "thinker": placement.thinker,
        "mm_aggregate": placement.thinker,
        "audio_encoder": placement.audio,
        "image_encoder": placement.vision,
        "talker": placement.talker,
        "vocoder": placement.talker,
    }.get(stage)
    if device is None or device.type != "cuda":
        return None

    # The talker and the vocoder are the first-audio path: their small kernels go ahead of
    # the thinker's long GEMMs when they share a GPU (a higher-priority stream is served
    # first whenever an SM frees up; nothing is preempted). The talker goes first of all:
    # its step paces every stream (50 steps a second is real time), while the vocoder's
    # batched windows are throughput work with slack.
    priority = stream_priorities().get(stage, 0)

    def init() -> None:
        torch.cuda.set_device(device)
        torch.cuda.set_stream(torch.cuda.Stream(device=device, priority=priority))

    return init
