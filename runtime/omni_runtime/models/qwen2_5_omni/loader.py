"""Loading Qwen2.5-Omni modules for the stages one process hosts, on the devices the plan names.

Two ways in:
- a checkpoint directory in the released layout (config.json, safetensors shards, tokenizer and
  processor files, spk_dict.pt) through transformers' ``from_pretrained`` with a device map, so
  the weight-name conversion and sharding stay transformers' business;
- ``load_format=dummy``: the config (from the directory, or the released 7B shape when there is
  none) built with random weights directly on the target device, for benchmarks.

Modules of stages this process does not host are dropped after loading.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omni_runtime.pipeline.options import EngineOptions
from omni_runtime.pipeline.types import EngineError

log = logging.getLogger(__name__)

# The released Qwen2.5-Omni-7B talker is a 0.5B-class decoder, smaller than the config default.
RELEASED_7B_TALKER = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 16, 0]},
}

THINKER_STAGES = frozenset({"thinker"})
EMBED_STAGES = frozenset({"mm_aggregate", "thinker", "talker", "talker_stream"})
TALKER_STAGES = frozenset({"talker", "talker_stream"})


@dataclass
class Placement:
    """Where each module lives; resolved once from the options."""

    dtype: torch.dtype
    thinker: torch.device
    audio: torch.device
    vision: torch.device
    talker: torch.device
    cuda_graphs: bool


@dataclass
class LoadedModel:
    thinker: Any  # Qwen2_5OmniThinkerForConditionalGeneration (possibly without some submodules)
    talker: Any | None
    token2wav: Any | None
    speakers: dict[str, dict[str, torch.Tensor]]
    processor: Any
    config: Any
    eos_token_ids: tuple[int, ...]
    placement: Placement
    path: Path | None
    load_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def resolve_placement(options: EngineOptions) -> Placement:
    """Map device/dtype/GPU flags to torch devices; explain impossible requests as EngineError."""
    want = options.device
    has_cuda = torch.cuda.is_available()
    if want == "cuda" and not has_cuda:
        raise EngineError(
            "device=cuda was asked but no CUDA GPU is visible; use --device cpu or auto", param="device"
        )
    use_cuda = has_cuda and want in ("auto", "cuda")
    if options.thinker_tp_size > 1:
        raise EngineError(
            f"thinker tensor parallelism ({options.thinker_tp_size}) is not implemented by the builtin runtime yet; "
            "use --thinker-tp-size 1 (one GPU holds the 7B thinker) or the sglang-omni runtime",
            param="thinker_tp_size",
        )
    if options.image_encoder_tp_size > 1:
        raise EngineError(
            "image-encoder tensor parallelism is not implemented by the builtin runtime yet; use 1",
            param="image_encoder_tp_size",
        )
    if not use_cuda:
        if options.thinker_gpus or options.talker_gpu is not None or options.image_encoder_gpus:
            log.warning("GPU placement flags ignored: running on the CPU")
        cpu = torch.device("cpu")
        dtype = _dtype(options.dtype, default=torch.float32)
        return Placement(dtype, cpu, cpu, cpu, cpu, cuda_graphs=False)
    count = torch.cuda.device_count()

    def gpu(index: int, flag: str) -> torch.device:
        if not 0 <= index < count:
            raise EngineError(
                f"{flag} names GPU {index} but this process sees {count} GPU(s) (0..{count - 1})", param=flag
            )
        return torch.device("cuda", index)

    thinker = gpu(options.thinker_gpus[0] if options.thinker_gpus else 0, "thinker_gpus")
    vision = (
        gpu(options.image_encoder_gpus[0], "image_encoder_gpus") if options.image_encoder_gpus else thinker
    )
    talker = gpu(options.talker_gpu, "talker_gpu") if options.talker_gpu is not None else thinker
    dtype = _dtype(options.dtype, default=torch.bfloat16)
    return Placement(dtype, thinker, thinker, vision, talker, cuda_graphs=True)


def _dtype(name: str, *, default: torch.dtype) -> torch.dtype:
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name == "auto":
        return default
    if name not in table:
        raise EngineError(f"unknown dtype {name!r}; use auto, float32, bfloat16 or float16", param="dtype")
    return table[name]


def load_processor(path: Path | None) -> Any:
    from transformers import Qwen2_5OmniProcessor

    if path is None:
        from omni_runtime.models.tiny import ensure_tiny_checkpoint

        path = ensure_tiny_checkpoint()  # dummy weights with no directory: borrow the tiny tokenizer
    return Qwen2_5OmniProcessor.from_pretrained(str(path))


def _eos_ids(path: Path | None, processor: Any) -> tuple[int, ...]:
    ids: list[int] = []
    if path is not None and (path / "generation_config.json").is_file():
        eos = json.loads((path / "generation_config.json").read_text()).get("eos_token_id")
        ids.extend(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    tok = processor.tokenizer
    for token in ("<|im_end|>", "<|endoftext|>"):
        tid = tok.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != tok.unk_token_id and tid not in ids:
            ids.append(tid)
    return tuple(int(i) for i in ids)


def _dummy_config(path: Path | None, processor: Any) -> Any:
    from transformers import AutoConfig, Qwen2_5OmniConfig

    if path is not None:
        return AutoConfig.from_pretrained(str(path))
    tok = processor.tokenizer
    tid = tok.convert_tokens_to_ids
    media = {
        "audio_token_index": tid("<|AUDIO|>"),
        "image_token_index": tid("<|IMAGE|>"),
        "video_token_index": tid("<|VIDEO|>"),
        "audio_start_token_id": tid("<|audio_bos|>"),
        "audio_end_token_id": tid("<|audio_eos|>"),
    }
    vision_ids = {
        "vision_start_token_id": tid("<|vision_bos|>"),
        "vision_end_token_id": tid("<|vision_eos|>"),
    }
    config = Qwen2_5OmniConfig(
        thinker_config={**media, **vision_ids, "user_token_id": tid("user")},
        talker_config={
            **RELEASED_7B_TALKER,
            **media,
            **vision_ids,
            "tts_text_start_token_id": tid("<|tts_text_bos|>"),
            "tts_text_end_token_id": tid("<|tts_text_eos|>"),
            "tts_text_pad_token_id": tid("<|tts_pad|>"),
        },
    )
    return config


def _random_speakers(config: Any, device: torch.device) -> dict[str, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    bos = int(config.talker_config.tts_text_start_token_id)
    return {
        name: {
            "bos_token": bos,
            "cond": torch.randn(1, 192, generator=gen),
            "ref_mel": torch.randn(1, 64, 80, generator=gen),
        }
        for name in ("Chelsie", "Ethan")
    }


def load_model(options: EngineOptions, *, path: Path | None, hosted: frozenset[str]) -> LoadedModel:
    """Build or load the modules the ``hosted`` stages need, on their devices."""
    started = time.monotonic()
    placement = resolve_placement(options)
    processor = load_processor(path)
    want_talker = bool(hosted & TALKER_STAGES)
    if options.load_format == "dummy":
        config = _dummy_config(path, processor)
        thinker, talker, token2wav = _build_dummy(config, placement, want_talker=want_talker)
        speakers = _random_speakers(config, placement.talker)
        if path is not None and (path / "spk_dict.pt").is_file():
            speakers = torch.load(path / "spk_dict.pt", weights_only=True)
    elif options.load_format == "auto":
        if path is None:
            raise EngineError("load_format=auto needs a model path", param="model_path")
        thinker, talker, token2wav, speakers, config = _load_checkpoint(
            path, placement, want_talker=want_talker
        )
    else:
        raise EngineError(
            f"unknown load format {options.load_format!r}; use auto or dummy", param="load_format"
        )
    thinker.eval()
    _drop_unhosted(thinker, hosted)
    if talker is not None:
        talker.eval()
        token2wav.eval().float()
    model = LoadedModel(
        thinker=thinker,
        talker=talker,
        token2wav=token2wav,
        speakers=speakers,
        processor=processor,
        config=config,
        eos_token_ids=_eos_ids(path, processor),
        placement=placement,
        path=path,
    )
    model.load_seconds = time.monotonic() - started
    return model


def _build_dummy(config: Any, placement: Placement, *, want_talker: bool):
    from transformers import (
        Qwen2_5OmniTalkerForConditionalGeneration,
        Qwen2_5OmniThinkerForConditionalGeneration,
        Qwen2_5OmniToken2WavModel,
    )

    # Random init on the target device (fast on a GPU), in the serving dtype from the start.
    with torch.device(placement.thinker):
        thinker = Qwen2_5OmniThinkerForConditionalGeneration._from_config(
            config.thinker_config, dtype=placement.dtype, attn_implementation="sdpa"
        )
    if placement.vision != placement.thinker:
        thinker.model.visual.to(placement.vision)
    talker = token2wav = None
    if want_talker:
        with torch.device(placement.talker):
            talker = Qwen2_5OmniTalkerForConditionalGeneration._from_config(
                config.talker_config, dtype=placement.dtype, attn_implementation="sdpa"
            )
            token2wav = Qwen2_5OmniToken2WavModel._from_config(
                config.token2wav_config, dtype=torch.float32, attn_implementation="sdpa"
            )
    return thinker, talker, token2wav


def _load_checkpoint(path: Path, placement: Placement, *, want_talker: bool):
    from transformers import AutoConfig, Qwen2_5OmniForConditionalGeneration

    config = AutoConfig.from_pretrained(str(path))
    config.enable_audio_output = want_talker
    kwargs: dict[str, Any] = {"config": config, "dtype": placement.dtype, "attn_implementation": "sdpa"}
    devices = {placement.thinker, placement.audio, placement.vision} | (
        {placement.talker} if want_talker else set()
    )
    if len(devices) == 1:
        kwargs["device_map"] = {"": str(placement.thinker)}
    else:
        kwargs["device_map"] = {
            "thinker.model.language_model": str(placement.thinker),
            "thinker.lm_head": str(placement.thinker),
            "thinker.model.audio_tower": str(placement.audio),
            "thinker.model.visual": str(placement.vision),
            **({"talker": str(placement.talker), "token2wav": str(placement.talker)} if want_talker else {}),
        }
    try:
        full = Qwen2_5OmniForConditionalGeneration.from_pretrained(str(path), **kwargs)
    except (OSError, ValueError) as exc:
        raise EngineError(f"cannot load the checkpoint in {path}: {exc}", param="model_path") from exc
    speakers = dict(full.speaker_map)
    talker = full.talker if want_talker else None
    token2wav = full.token2wav if want_talker else None
    return full.thinker, talker, token2wav, speakers, config


def _drop_unhosted(thinker: Any, hosted: frozenset[str]) -> None:
    """Free the weights of stages served by another process."""
    inner = thinker.model
    if "audio_encoder" not in hosted and hasattr(inner, "audio_tower"):
        del inner.audio_tower
    if "image_encoder" not in hosted and hasattr(inner, "visual"):
        del inner.visual
    if "thinker" not in hosted:
        inner.language_model.layers = torch.nn.ModuleList()
        if not hosted & EMBED_STAGES:
            inner.language_model.embed_tokens = None
        thinker.lm_head = None
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
