"""Loading the Qwen3-Omni-MoE modules of the thinker-side stages a process hosts.

As for Qwen2.5-Omni (qwen2_5_omni/loader.py, whose checkpoint reader, module builder and
placement this reuses), each stage's submodule is built on its device without weight init and
filled from the safetensors shards of the released layout (``thinker.model.*``,
``thinker.lm_head``, ``thinker.audio_tower.*``, ``thinker.visual.*``). The released checkpoint
stores each expert's ``gate_proj``/``up_proj``/``down_proj`` apart while transformers 5.23's MoE
block holds them fused (``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj`` [E, H, I]):
:func:`load_text_model` stacks them, one decoder layer at a time so the peak stays one layer
above the weights. ``load_format=dummy`` builds the same modules with random weights. The
thinker's MoE blocks run the runtime's fused decode kernels (executor.moe_decode, ``omni_fused``:
Triton at decode, transformers' ``grouped_mm`` for prefill), the talker's ``grouped_mm``;
``OMNI_MOE_EXPERTS`` picks one for both. No path has a per-expert Python loop.

The talker stage loads the talker (``talker.model.*`` MoE layers stacked the same way, its
text/hidden projections, ``codec_head`` and ``code_predictor``), Code2Wav (``code2wav.*``, in
float32 as transformers runs it) and the thinker embeddings of the three tts tokens it feeds
itself.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf

from omni_runtime.contract import switches
from omni_runtime.contract.engine import EngineError
from omni_runtime.contract.options import EngineOptions
from omni_runtime.executor import moe_decode, triton_support
from omni_runtime.executor.tensor_parallel import check_tp_size, shard_text_model
from omni_runtime.executor.tp_group import TPLeader
from omni_runtime.models.qwen2_5_omni.loader import (
    Checkpoint,
    build_module,
    eos_ids,
    fill_dummy_embedding,
    thinker_embedding_rows,
)
from omni_runtime.models.qwen2_5_omni.placement import Placement, resolve_placement
from omni_runtime.models.qwen3_omni_moe.attention import fuse_qkv
from omni_runtime.models.qwen3_omni_moe.config import ensure_talker_fields

log = logging.getLogger(__name__)

_FUSED = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}
# The experts kernels: the runtime's omni_fused (two Triton kernels per MoE block at decode,
# executor.moe_decode), and transformers' grouped_mm (torch's grouped GEMM over tokens sorted by
# expert, routing on the device, no host sync: CUDA-graph capturable), batched_mm (a gathered bmm
# per token-expert pair) and eager (its per-expert Python loop, with a host sync per step).
MOE_EXPERTS = switches.BY_NAME["OMNI_MOE_EXPERTS"].choices  # moe_decode.NAME first


class RopeIndex:
    """``get_rope_index`` (3D mrope positions) without a model object: it only reads the config."""

    get_rope_index = hf.Qwen3OmniMoePreTrainedModelForConditionalGeneration.get_rope_index
    get_llm_pos_ids_for_vision = (
        hf.Qwen3OmniMoePreTrainedModelForConditionalGeneration.get_llm_pos_ids_for_vision
    )
    get_chunked_index = hf.Qwen3OmniMoePreTrainedModelForConditionalGeneration.get_chunked_index

    def __init__(self, config: Any) -> None:
        self.config = config
        self.spatial_merge_size = config.vision_config.spatial_merge_size


@dataclass
class LoadedQwen3:
    """The thinker-side modules of the hosted stages; None where this process hosts no such stage."""

    config: Any
    processor: Any
    eos_token_ids: tuple[int, ...]
    placement: Placement
    path: Path
    rope: Any  # RopeIndex over the thinker config
    text: Any = None  # Qwen3OmniMoeThinkerTextModel (embed_tokens, MoE layers, norm, rotary_emb)
    embed: Any = None
    lm_head: Any = None
    audio_tower: Any = None
    visual: Any = None  # Qwen3OmniMoeVisionEncoder (merged patches plus DeepStack features)
    talker: Any = None  # Qwen3OmniMoeTalkerForConditionalGeneration (with its code predictor)
    code2wav: Any = None  # Qwen3OmniMoeCode2Wav
    text_vectors: dict[int, torch.Tensor] | None = None  # thinker embeddings of tts bos/eos/pad
    load_seconds: float = 0.0
    tp: Any = None  # rank 0 under thinker TP: tp_group.TPLeader driving the follower processes
    tp_rank: int = 0
    tp_world: int = 1


def load_text_model(
    ckpt: Checkpoint, model: nn.Module, prefix: str, device: torch.device, dtype: torch.dtype
) -> None:
    """Fill ``model`` from keys under ``prefix``, stacking per-expert weights into fused tensors."""
    groups: dict[str, list[str]] = {}
    for name in model.state_dict():
        parts = name.split(".")
        groups.setdefault(".".join(parts[:2]) if parts[0] == "layers" else "", []).append(name)
    loaded: set[str] = set()
    for names in groups.values():  # one decoder layer at a time
        sources: dict[str, list[str]] = {}
        for name in names:
            owner, _, leaf = name.rpartition(".")
            if prefix + name not in ckpt.files and owner.endswith("mlp.experts") and leaf in _FUSED:
                experts = model.get_parameter(name).shape[0]
                sources[name] = [
                    f"{prefix}{owner}.{e}.{part}.weight" for e in range(experts) for part in _FUSED[leaf]
                ]
            else:
                sources[name] = [prefix + name]
        missing = [key for keys in sources.values() for key in keys if key not in ckpt.files]
        if missing:
            raise EngineError(
                f"checkpoint lacks {len(missing)} weights of {prefix.rstrip('.')} (e.g. {missing[0]}); "
                "is this a Qwen3-Omni-MoE checkpoint?",
                param="model_path",
            )
        tensors = ckpt.read([key for keys in sources.values() for key in keys], device)
        state = {}
        for name, keys in sources.items():
            if len(keys) == 1:
                state[name] = tensors[keys[0]]
                continue
            per_expert = len(_FUSED[name.rpartition(".")[2]])
            rows = [torch.cat(pieces) for pieces in _chunks([tensors[k] for k in keys], per_expert)]
            state[name] = torch.stack(rows)
        target = model.state_dict()
        state = {
            k: v.to(dtype if target[k].is_floating_point() else target[k].dtype) for k, v in state.items()
        }
        model.load_state_dict(state, strict=False)
        loaded |= set(state)
        del tensors, state
    unset = set(model.state_dict()) - loaded
    if unset:
        raise EngineError(
            f"weights of {prefix.rstrip('.')} not loaded: {sorted(unset)[:3]}", param="model_path"
        )


def _chunks(items: list[torch.Tensor], size: int) -> list[list[torch.Tensor]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def experts_implementation(value: str | None, *, stage: str = "thinker") -> str:
    """The MoE experts kernel from ``OMNI_MOE_EXPERTS`` (both stages). Unset: for the thinker the
    runtime's ``omni_fused`` where Triton is installed (decode rows on CUDA; prefill, larger batches
    and CPU tensors go to ``grouped_mm`` inside it), else ``grouped_mm``; for the talker
    ``grouped_mm``. On an H200 ``omni_fused`` made the 30B-A3B thinker's decode step 1.1-1.4x
    faster, while streaming speech (talker-bound) was no faster with it on the talker
    (docs/benchmarks.md)."""
    fused_default = stage == "thinker" and triton_support.triton_available()
    choice = (value or "").strip() or (moe_decode.NAME if fused_default else "grouped_mm")
    if choice not in MOE_EXPERTS:
        raise EngineError(
            f"OMNI_MOE_EXPERTS is {choice!r}; use one of {', '.join(MOE_EXPERTS)}", param="OMNI_MOE_EXPERTS"
        )
    if choice == moe_decode.NAME:
        if not triton_support.triton_available():
            raise EngineError(
                f"OMNI_MOE_EXPERTS is {choice!r} but Triton is not installed; install triton or use grouped_mm",
                param="OMNI_MOE_EXPERTS",
            )
        moe_decode.register()
    return choice


def use_experts(model: nn.Module, implementation: str) -> int:
    """Point every experts module of ``model`` at ``implementation``; how many there are. The
    runtime's ``omni_fused`` also fuses each router's softmax, top-k and renormalisation."""
    count = 0
    for module in model.modules():
        if hasattr(module, "_is_expert_parallel"):  # transformers' use_experts_implementation classes
            config: Any = module.config
            config._experts_implementation = implementation
            count += 1
    moe_decode.fuse_routers(model, implementation == moe_decode.NAME)
    return count


def load_model(
    options: EngineOptions, *, path: Path, hosted: frozenset[str], tp_rank: int = 0
) -> LoadedQwen3:
    """Build or load the thinker-side modules the ``hosted`` stages need, on their devices.

    With --thinker-tp-size N a process hosting the thinker is rank 0 of its TP group (it spawns
    the followers, tp_group) or, with ``tp_rank`` > 0, a follower (entrypoints/tp_follower.py):
    every rank builds the whole text model (dummy weights from one seed) and keeps its shard.
    """
    from transformers import AutoConfig

    started = time.monotonic()
    # Every refusal comes before any follower starts.
    if options.load_format not in ("auto", "dummy"):
        raise EngineError(
            f"unknown load format {options.load_format!r}; use auto or dummy", param="load_format"
        )
    if options.image_encoder_tp_size > 1:
        raise EngineError(
            "image-encoder tensor parallelism is not supported for Qwen3-Omni-MoE in the builtin runtime "
            "yet (its vision tower is small); use --image-encoder-tp-size 1",
            param="image_encoder_tp_size",
        )
    config = ensure_talker_fields(AutoConfig.from_pretrained(str(path)))
    tp_world = options.thinker_tp_size if "thinker" in hosted else 1
    if tp_world > 1:
        check_tp_size(config.thinker_config.text_config, tp_world)
    leader = TPLeader(options, model_path=path) if tp_world > 1 and tp_rank == 0 else None
    try:
        loaded = _load(options, path=path, config=config, hosted=hosted, tp_rank=tp_rank, tp_world=tp_world)
        if leader is not None:
            leader.connect(loaded.placement.thinker)  # waits for every follower to load its shard
    except BaseException:
        if leader is not None:
            leader.close()
        raise
    loaded.tp = leader
    loaded.load_seconds = time.monotonic() - started
    rank = f" (thinker TP rank {tp_rank} of {tp_world})" if tp_world > 1 else ""
    log.info("loaded %s for stages %s in %.1fs%s", path, ",".join(sorted(hosted)), loaded.load_seconds, rank)
    return loaded


def _load(
    options: EngineOptions, *, path: Path, config: Any, hosted: frozenset[str], tp_rank: int, tp_world: int
) -> LoadedQwen3:
    from transformers import Qwen3OmniMoeProcessor

    placement = resolve_placement(options, tp_rank=tp_rank)
    processor = Qwen3OmniMoeProcessor.from_pretrained(str(path))
    thinker_cfg = config.thinker_config
    random = options.load_format == "dummy"
    ckpt = None if random else Checkpoint(path)
    loaded = LoadedQwen3(
        config=config,
        processor=processor,
        eos_token_ids=eos_ids(path, processor),
        placement=placement,
        path=path,
        rope=RopeIndex(thinker_cfg),
        tp_rank=tp_rank,
        tp_world=tp_world,
    )
    dtype, text_cfg = placement.dtype, thinker_cfg.text_config
    if "thinker" in hosted:
        text = build_module(
            hf.Qwen3OmniMoeThinkerTextModel, text_cfg, device=placement.thinker, dtype=dtype, random=random
        )
        if ckpt is not None:
            load_text_model(ckpt, text, "thinker.model.", placement.thinker, dtype)
        else:
            fill_dummy_embedding(text.embed_tokens.weight)  # as a lone mm_aggregate's, below
        use_experts(text, experts_implementation(os.environ.get("OMNI_MOE_EXPERTS")))
        shard_text_model(text, text_cfg, rank=tp_rank, world=tp_world, group=None)
        if placement.thinker.type == "cuda":
            fuse_qkv(text)  # one GEMM for q, k and v (attention.py); on CPU the launches cost nothing
        loaded.text, loaded.embed = text, text.embed_tokens
        with torch.device(placement.thinker):
            head = nn.Linear(text_cfg.hidden_size, text_cfg.vocab_size, bias=False, dtype=dtype)
        if tp_rank > 0:
            nn.init.zeros_(head.weight)  # followers never sample: their logits are discarded
        elif ckpt is not None:
            ckpt.load_into(head, "thinker.lm_head.", placement.thinker, dtype)
        else:
            nn.init.normal_(head.weight, std=0.02)
        loaded.lm_head = head.eval()
    elif "mm_aggregate" in hosted:
        with torch.device(placement.thinker):
            embed = nn.Embedding(text_cfg.vocab_size, text_cfg.hidden_size, dtype=dtype)
        if ckpt is not None:
            ckpt.load_into(embed, "thinker.model.embed_tokens.", placement.thinker, dtype)
        else:
            fill_dummy_embedding(embed.weight)  # the thinker's own table in another process
        loaded.embed = embed.eval()

    def tower(cls: Any, cfg: Any, prefix: str, device: torch.device) -> Any:
        module = build_module(cls, cfg, device=device, dtype=dtype, random=random)
        if ckpt is not None:
            ckpt.load_into(module, prefix, device, dtype)
        return module

    if "audio_encoder" in hosted:
        loaded.audio_tower = tower(
            hf.Qwen3OmniMoeAudioEncoder, thinker_cfg.audio_config, "thinker.audio_tower.", placement.audio
        )
    if "image_encoder" in hosted:
        loaded.visual = tower(
            hf.Qwen3OmniMoeVisionEncoder, thinker_cfg.vision_config, "thinker.visual.", placement.vision
        )
    if "talker" in hosted:
        _load_speech(loaded, ckpt, random=random)
    return loaded


def _load_speech(loaded: LoadedQwen3, ckpt: Checkpoint | None, *, random: bool) -> None:
    """The talker with its code predictor, Code2Wav and the tts text vectors, on the talker device."""
    config, placement = loaded.config, loaded.placement
    device, dtype = placement.talker, placement.dtype
    talker = build_module(
        hf.Qwen3OmniMoeTalkerForConditionalGeneration,
        config.talker_config,
        device=device,
        dtype=dtype,
        random=random,
    )
    if ckpt is not None:
        load_text_model(ckpt, talker.model, "talker.model.", device, dtype)
        for part in ("text_projection", "hidden_projection", "codec_head", "code_predictor"):
            ckpt.load_into(getattr(talker, part), f"talker.{part}.", device, dtype)
    else:  # transformers leaves the talker's experts as torch.empty left them
        from omni_runtime.models.qwen3_omni_moe.tiny import init_experts

        init_experts(talker, generator=torch.Generator().manual_seed(0))
    use_experts(talker, experts_implementation(os.environ.get("OMNI_MOE_EXPERTS"), stage="talker"))
    loaded.talker = talker
    code2wav = build_module(
        hf.Qwen3OmniMoeCode2Wav, config.code2wav_config, device=device, dtype=torch.float32, random=random
    )
    if ckpt is not None:
        ckpt.load_into(code2wav, "code2wav.", device, torch.float32)
    loaded.code2wav = code2wav
    ids = sorted({int(config.tts_bos_token_id), int(config.tts_eos_token_id), int(config.tts_pad_token_id)})
    size = config.thinker_config.text_config.hidden_size
    loaded.text_vectors = thinker_embedding_rows(
        loaded.embed, ckpt, ids, size=size, device=device, dtype=dtype
    )
