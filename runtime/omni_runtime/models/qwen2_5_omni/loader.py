"""Loading the Qwen2.5-Omni modules of the stages one process hosts, on the devices the plan names.

A stage process builds only its own submodules (thinker text model, audio tower, vision tower,
talker, token2wav) directly on their target devices, without running weight init, and fills
them from the checkpoint's safetensors shards (released layout: ``thinker.model.*``,
``thinker.audio_tower.*``, ``thinker.visual.*``, ``thinker.lm_head``, ``talker.*``,
``token2wav.*``), reading each tensor straight onto its device. So the talker pod never loads the
7B thinker, and the API process (preprocessing and decode only) loads no weights at all.
``load_format=dummy`` builds the same modules with random weights on the device (fast on a GPU);
with no directory it uses the released 7B shapes.

With --thinker-tp-size N the worker is rank 0 of a tensor-parallel group: it spawns the follower
processes (tp_group), and every rank builds the full thinker text model (dummy weights from one
seed, so all ranks draw the same tensors), keeps its shard of each decoder layer
(tensor_parallel.shard_text_model) and joins the group once loaded.

With --image-encoder-tp-size N a process that hosts only the image encoder is rank 0 (or, in a
follower, rank R) of the vision group the same way (vision_tp); a process that hosts the encoder
next to other stages starts that dedicated process instead (vision_stage) and loads no tower.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import zlib
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as hf

from omni_runtime.contract.engine import EngineError
from omni_runtime.contract.options import EngineOptions
from omni_runtime.executor.tensor_parallel import check_tp_size, shard_text_model
from omni_runtime.executor.tp_group import TPLeader
from omni_runtime.executor.vision_stage import VisionStageChild
from omni_runtime.models.qwen2_5_omni.placement import LoadedModel, resolve_placement
from omni_runtime.models.qwen2_5_omni.vision_tp import LeaderVision, check_vision_tp_size, shard_vision_tower

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
TALKER_STAGES = frozenset({"talker", "talker_stream"})
DUMMY_SEED = 20250326


class RopeIndex:
    """``get_rope_index`` (3D mrope positions) without a model object: it only reads the config."""

    get_rope_index = hf.Qwen2_5OmniPreTrainedModelForConditionalGeneration.get_rope_index
    get_llm_pos_ids_for_vision = (
        hf.Qwen2_5OmniPreTrainedModelForConditionalGeneration.get_llm_pos_ids_for_vision
    )
    get_chunked_index = hf.Qwen2_5OmniPreTrainedModelForConditionalGeneration.get_chunked_index

    def __init__(self, config: Any, spatial_merge_size: int) -> None:
        self.config = config
        self.spatial_merge_size = spatial_merge_size


class Checkpoint:
    """Tensor lookup across the safetensors shards of a checkpoint directory."""

    def __init__(self, path: Path) -> None:
        from safetensors import safe_open

        self._open = safe_open
        index = path / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            self.files = {key: path / name for key, name in weight_map.items()}
        elif (path / "model.safetensors").is_file():
            with safe_open(str(path / "model.safetensors"), "pt") as f:
                self.files = {key: path / "model.safetensors" for key in f.keys()}  # noqa: SIM118
        else:
            raise EngineError(
                f"no safetensors weights in {path} (model.safetensors or an index)", param="model_path"
            )

    def load_into(self, module: nn.Module, prefix: str, device: torch.device, dtype: torch.dtype) -> None:
        """Fill ``module``'s parameters and persistent buffers from keys under ``prefix``."""
        wanted = module.state_dict()
        by_file: dict[Path, list[str]] = {}
        missing = []
        for name in wanted:
            key = prefix + name
            if key not in self.files:
                missing.append(key)
            else:
                by_file.setdefault(self.files[key], []).append(name)
        if missing:
            raise EngineError(
                f"checkpoint lacks {len(missing)} weights of {prefix.rstrip('.')} (e.g. {missing[0]}); "
                "is this a Qwen2.5-Omni checkpoint?",
                param="model_path",
            )
        state: dict[str, torch.Tensor] = {}
        for file, names in by_file.items():
            with self._open(str(file), "pt", device=str(device)) as f:
                for name in names:
                    tensor = f.get_tensor(prefix + name)
                    target = wanted[name]
                    state[name] = tensor.to(target.dtype if not target.is_floating_point() else dtype)
        module.load_state_dict(state, strict=True)

    def read(self, keys: list[str], device: torch.device) -> dict[str, torch.Tensor]:
        """These tensors, straight onto ``device``, opening each shard once."""
        by_file: dict[Path, list[str]] = {}
        for key in keys:
            by_file.setdefault(self.files[key], []).append(key)
        out: dict[str, torch.Tensor] = {}
        for file, names in by_file.items():
            with self._open(str(file), "pt", device=str(device)) as f:
                for key in names:
                    out[key] = f.get_tensor(key)
        return out

    def rows(self, key: str, ids: list[int]) -> torch.Tensor:
        with self._open(str(self.files[key]), "pt") as f:
            table = f.get_slice(key)
            return torch.stack([table[i] for i in ids])


def build_module(cls: Any, config: Any, *, device: torch.device, dtype: torch.dtype, random: bool) -> Any:
    """Construct on the device; skip weight init when weights are about to be loaded (both families).

    Random (dummy) weights are seeded by the class: every process and every tensor-parallel rank
    that builds a module draws the same tensors, whichever other modules it hosts, and so does the
    next start of the server (an A/B bench's two sides serve the same model)."""
    from transformers.initialization import no_init_weights

    # The current-device guard matters for a module placed on another GPU than cuda:0: some
    # initialisers allocate on the *current* device, not the device context's.
    guard = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with guard, torch.device(device):
        if random:
            torch.manual_seed(DUMMY_SEED + zlib.crc32(cls.__name__.encode()))
            module = cls._from_config(config, dtype=dtype, attn_implementation="sdpa")
        else:
            with no_init_weights():
                module = cls._from_config(config, dtype=dtype, attn_implementation="sdpa")
    return module.eval()


DUMMY_EMBED_STD = 0.02
_DUMMY_EMBED_CHUNK = 8192  # rows drawn at a time (the draw's int64 temporaries stay ~0.25 GB at 7B)


def dummy_embedding_rows(ids: torch.Tensor, size: int) -> torch.Tensor:
    """Rows ``ids`` of the dummy thinker embedding, float32 on ``ids``' device: each value a
    function of (row, column) alone (a counter hash through Box-Muller), so a process that holds
    the whole table, one that holds only the multimodal aggregation's copy and one that needs a
    few rows for the talker all see the same vectors, whatever the device or the placement."""
    mask = 0xFFFFFFFF
    col = torch.arange(size, device=ids.device, dtype=torch.int64)
    h = (ids.to(torch.int64)[:, None] * 0x9E3779B1 + col[None, :] * 0x85EBCA77 + DUMMY_SEED) & mask
    for shift, mult in ((16, 0x7FEB352D), (15, 0x846CA68B), (16, 0x2C1B3C6D)):  # a 32-bit mixer
        h = ((h ^ (h >> shift)) * mult) & mask
    u1 = ((h & 0xFFFF).double() + 0.5) / 65536.0
    u2 = ((h >> 16).double() + 0.5) / 65536.0
    normal = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * torch.pi * u2)
    return (normal * DUMMY_EMBED_STD).float()


def fill_dummy_embedding(weight: torch.Tensor) -> None:
    """Write `dummy_embedding_rows` of every row into a [vocab, hidden] table, in place."""
    with torch.no_grad():
        for start in range(0, weight.shape[0], _DUMMY_EMBED_CHUNK):
            ids = torch.arange(start, min(start + _DUMMY_EMBED_CHUNK, weight.shape[0]), device=weight.device)
            weight[start : start + len(ids)] = dummy_embedding_rows(ids, weight.shape[1]).to(weight.dtype)


def load_processor(path: Path | None) -> Any:
    from transformers import Qwen2_5OmniProcessor

    if path is None:
        from omni_runtime.models.qwen2_5_omni.tiny import ensure_tiny_checkpoint

        path = ensure_tiny_checkpoint()  # dummy 7B weights with no directory: borrow the tiny tokenizer
    return Qwen2_5OmniProcessor.from_pretrained(str(path))


def eos_ids(path: Path | None, processor: Any) -> tuple[int, ...]:
    """generation_config.json's EOS ids plus <|im_end|> and <|endoftext|> (both families)."""
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


def _config(path: Path | None, processor: Any) -> Any:
    from transformers import AutoConfig

    if path is not None:
        return AutoConfig.from_pretrained(str(path))
    return released_7b_config(processor)


def released_7b_config(processor: Any) -> Any:
    """The released Qwen2.5-Omni-7B shape, with the special-token ids of the tokenizer we serve with."""
    from transformers import Qwen2_5OmniConfig

    tid = processor.tokenizer.convert_tokens_to_ids
    media = {
        "audio_token_index": tid("<|AUDIO|>"),
        "image_token_index": tid("<|IMAGE|>"),
        "video_token_index": tid("<|VIDEO|>"),
        "audio_start_token_id": tid("<|audio_bos|>"),
        "audio_end_token_id": tid("<|audio_eos|>"),
        "vision_start_token_id": tid("<|vision_bos|>"),
        "vision_end_token_id": tid("<|vision_eos|>"),
    }
    return Qwen2_5OmniConfig(
        thinker_config={**media, "user_token_id": tid("user")},
        talker_config={
            **RELEASED_7B_TALKER,
            **media,
            "tts_text_start_token_id": tid("<|tts_text_bos|>"),
            "tts_text_end_token_id": tid("<|tts_text_eos|>"),
            "tts_text_pad_token_id": tid("<|tts_pad|>"),
        },
    )


def load_speakers(path: Path | None, config: Any) -> dict[str, dict[str, Any]]:
    """The checkpoint's ``spk_dict.pt``, or two random voices for dummy weights (the HF baseline
    and the vocoder profile use the same entries as the runtime)."""
    if path is not None and (path / "spk_dict.pt").is_file():
        return dict(torch.load(path / "spk_dict.pt", weights_only=True))
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


def load_model(
    options: EngineOptions, *, path: Path | None, hosted: frozenset[str], tp_rank: int = 0
) -> LoadedModel:
    """Build or load the modules the ``hosted`` stages need, on their devices.

    ``tp_rank`` > 0 only in a TP follower process (tp_follower), which hosts the thinker or, for
    the image encoder's group, only the image encoder.
    """
    started = time.monotonic()
    if options.load_format not in ("auto", "dummy"):
        raise EngineError(
            f"unknown load format {options.load_format!r}; use auto or dummy", param="load_format"
        )
    tp_world = options.thinker_tp_size if "thinker" in hosted else 1
    vision_world = options.image_encoder_tp_size if "image_encoder" in hosted else 1
    # The vision group lives in a process that hosts nothing else (its default group is free).
    vision_here = vision_world > 1 and hosted == frozenset({"image_encoder"})
    thinker_rank, vision_rank = (tp_rank if tp_world > 1 else 0), (tp_rank if vision_here else 0)
    placement = resolve_placement(options, tp_rank=thinker_rank, vision_rank=vision_rank)
    processor = load_processor(path)
    config = _config(path, processor)
    if tp_world > 1:
        check_tp_size(config.thinker_config.text_config, tp_world)
    if vision_world > 1:  # before any process starts
        check_vision_tp_size(config.thinker_config.vision_config, vision_world)
    leader = TPLeader(options, model_path=path) if tp_world > 1 and tp_rank == 0 else None
    vision_leader = (
        TPLeader(options, model_path=path, role="image_encoder") if vision_here and tp_rank == 0 else None
    )
    # Started first, so it loads while this process loads its own stages.
    child = VisionStageChild(options, model_path=path) if vision_world > 1 and not vision_here else None
    try:
        loaded = _load_parts(
            options,
            path=path,
            hosted=hosted - {"image_encoder"} if child is not None else hosted,
            placement=placement,
            processor=processor,
            config=config,
            tp_rank=thinker_rank,
            tp_world=tp_world,
            vision_rank=vision_rank,
            vision_world=vision_world if vision_here else 1,
        )
        if leader is not None:
            leader.connect(placement.thinker)  # waits for every follower to load its shard
        if vision_leader is not None:
            vision_leader.connect(placement.vision)
            loaded.visual = LeaderVision(loaded.visual, vision_leader)
    except BaseException:
        for closing in (leader, vision_leader, child):
            if closing is not None:
                closing.close()
        raise
    loaded.tp, loaded.vision_tp, loaded.vision_stage = leader, vision_leader, child
    loaded.vision_tp_world = vision_world
    loaded.load_seconds = time.monotonic() - started
    ranks = []
    if tp_world > 1:
        ranks.append(f"thinker TP rank {tp_rank} of {tp_world}")
    if vision_here:
        ranks.append(f"image-encoder TP rank {tp_rank} of {vision_world}")
    if child is not None:
        ranks.append("the image encoder in its own stage process")
    log.info(
        "loaded %s for stages %s in %.1fs%s",
        path or "dummy 7B",
        ",".join(sorted(hosted)),
        loaded.load_seconds,
        f" ({', '.join(ranks)})" if ranks else "",
    )
    return loaded


def _load_parts(
    options: EngineOptions,
    *,
    path: Path | None,
    hosted: frozenset[str],
    placement: Any,
    processor: Any,
    config: Any,
    tp_rank: int,
    tp_world: int,
    vision_rank: int,
    vision_world: int,
) -> LoadedModel:
    random = options.load_format == "dummy"
    ckpt = None if random else Checkpoint(path)  # type: ignore[arg-type]
    thinker_cfg = config.thinker_config
    loaded = LoadedModel(
        config=config,
        processor=processor,
        eos_token_ids=eos_ids(path, processor),
        speakers=load_speakers(path, config),
        placement=placement,
        path=path,
        rope=RopeIndex(thinker_cfg, thinker_cfg.vision_config.spatial_merge_size),
        tp_rank=tp_rank,
        tp_world=tp_world,
    )

    def part(cls: Any, cfg: Any, prefix: str, device: torch.device, dtype: torch.dtype) -> Any:
        module = build_module(cls, cfg, device=device, dtype=dtype, random=random)
        if ckpt is not None:
            ckpt.load_into(module, prefix, device, dtype)
        return module

    dtype = placement.dtype
    if "thinker" in hosted:
        loaded.text = part(
            hf.Qwen2_5OmniThinkerTextModel,
            thinker_cfg.text_config,
            "thinker.model.",
            placement.thinker,
            dtype,
        )
        if random:
            fill_dummy_embedding(loaded.text.embed_tokens.weight)  # as a lone mm_aggregate's, below
        text_cfg = thinker_cfg.text_config
        shard_text_model(loaded.text, text_cfg, rank=tp_rank, world=tp_world, group=None)
        loaded.embed = loaded.text.embed_tokens
        with torch.device(placement.thinker):
            head = nn.Linear(text_cfg.hidden_size, text_cfg.vocab_size, bias=False, dtype=dtype)
        if tp_rank > 0:
            nn.init.zeros_(head.weight)  # followers never sample: their logits are discarded
        elif (
            getattr(text_cfg, "tie_word_embeddings", False)
            and ckpt is not None
            and "thinker.lm_head.weight" not in ckpt.files
        ):
            head.weight = loaded.embed.weight
        elif ckpt is not None:
            ckpt.load_into(head, "thinker.lm_head.", placement.thinker, dtype)
        else:
            nn.init.normal_(head.weight, std=0.02)
        loaded.lm_head = head.eval()
    elif "mm_aggregate" in hosted:
        text_cfg = thinker_cfg.text_config
        with torch.device(placement.thinker):
            embed = nn.Embedding(text_cfg.vocab_size, text_cfg.hidden_size, dtype=dtype)
        if ckpt is not None:
            ckpt.load_into(embed, "thinker.model.embed_tokens.", placement.thinker, dtype)
        else:
            fill_dummy_embedding(embed.weight)  # the thinker's own table in another process
        loaded.embed = embed.eval()
    if "audio_encoder" in hosted:
        loaded.audio_tower = part(
            hf.Qwen2_5OmniAudioEncoder,
            thinker_cfg.audio_config,
            "thinker.audio_tower.",
            placement.audio,
            dtype,
        )
    if "image_encoder" in hosted:
        loaded.visual = part(
            hf.Qwen2_5OmniVisionEncoder, thinker_cfg.vision_config, "thinker.visual.", placement.vision, dtype
        )
        shard_vision_tower(
            loaded.visual, thinker_cfg.vision_config, rank=vision_rank, world=vision_world, group=None
        )
    if hosted & TALKER_STAGES:
        loaded.talker = part(
            hf.Qwen2_5OmniTalkerForConditionalGeneration,
            config.talker_config,
            "talker.",
            placement.talker,
            dtype,
        )
        loaded.token2wav = part(
            hf.Qwen2_5OmniToken2WavModel,
            config.token2wav_config,
            "token2wav.",
            placement.talker,
            torch.float32,
        )
        loaded.text_vectors = _text_vectors(loaded, ckpt)
    return loaded


def _text_vectors(loaded: LoadedModel, ckpt: Checkpoint | None) -> dict[int, torch.Tensor]:
    """Thinker embeddings of the speaker BOS tokens and tts EOS/PAD, which the talker feeds itself."""
    cfg = loaded.config.talker_config
    ids = sorted(
        {int(s["bos_token"]) for s in loaded.speakers.values()}
        | {int(cfg.tts_text_end_token_id), int(cfg.tts_text_pad_token_id)}
    )
    return thinker_embedding_rows(
        loaded.embed,
        ckpt,
        ids,
        size=cfg.embedding_size,
        device=loaded.placement.talker,
        dtype=loaded.placement.dtype,
    )


def thinker_embedding_rows(
    embed: Any,
    ckpt: Checkpoint | None,
    ids: list[int],
    *,
    size: int,
    device: torch.device,
    dtype: torch.dtype,
) -> dict[int, torch.Tensor]:
    """Rows ``ids`` of the thinker's token embedding (from the loaded table, else the checkpoint,
    else the dummy table's, `dummy_embedding_rows`) on the talker's device (both families)."""
    if embed is not None:
        with torch.inference_mode():
            rows = embed(torch.tensor(ids, device=embed.weight.device))
    elif ckpt is not None:
        rows = ckpt.rows("thinker.model.embed_tokens.weight", ids)
    else:  # the dummy table's rows, as a process holding it has them
        rows = dummy_embedding_rows(torch.tensor(ids), size)
    return {i: rows[n].to(device, dtype) for n, i in enumerate(ids)}
