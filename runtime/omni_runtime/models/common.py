"""What the model families share: chat messages with media for a processor, and KV-cache sizing.

Each family's adapter turns a request into its processor's chat messages the same way (one
content part per medium, audio at 16 kHz) and sizes its slot KV cache against the same GPU
budget; only the processors, modules and token ids differ.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omni_runtime.contract.adapter import Prompt
from omni_runtime.contract.engine import EngineError, GenerationRequest
from omni_runtime.contract.params import whole_number
from omni_runtime.models.whisper_features import short_features

log = logging.getLogger(__name__)

AUDIO_RATE = 16000
KV_RESERVE_BYTES = 3 << 30  # activations, CUDA graphs, the talker's cache and the vocoder after it
DEFAULT_VIDEO_FPS = 2.0


FEATURE_CACHE_BYTES = 64 << 20  # about 43 audios' 30 s feature windows (128 x 3000 float32 and a mask each)


class AudioFeatureCache:
    """The processor's audio feature extractor, each audio extracted once and kept by content.

    A conversation's prompt carries every earlier turn's audio (realtime and chat sessions send
    the whole history each turn), and Qwen-Omni's processors extract Whisper features padded to
    30 s for every audio each time: about 15 ms of CPU an audio, on the one preprocessing thread
    every session shares. With ``padding="max_length"`` each audio's features depend on that audio
    alone, so extracting the audios one at a time and stacking them gives the processor's batch
    exactly; kept ones are reused (LRU, bounded by bytes). A new audio's features are computed
    over the audio alone rather than over 30 s (`whisper_features`: 3.8 ms instead of 10.8 for 1.5 s
    on one core), once a first audio showed both ways equal. Everything else the processor asks
    of its feature extractor (``hop_length``, ``sampling_rate``, ...) passes through.
    """

    def __init__(self, extractor: Any, *, capacity_bytes: int = FEATURE_CACHE_BYTES) -> None:
        self.extractor = extractor
        self.capacity = capacity_bytes
        self._entries: OrderedDict[tuple[bytes, str], tuple[dict[str, Any], int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        # Whether features come from the audio alone (whisper_features): None until a first audio
        # has been extracted both ways and compared.
        self.short_path: bool | None = None
        self.short_calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.extractor, name)

    def __call__(self, audio: Any, **kwargs: Any) -> Any:
        if kwargs.get("padding") != "max_length" or kwargs.get("return_tensors") != "pt":
            return self.extractor(audio, **kwargs)  # features that depend on the batch: not kept
        items = list(audio) if isinstance(audio, (list, tuple)) else [audio]
        options = repr(sorted(kwargs.items()))
        parts = [self._one(np.asarray(item, dtype=np.float32), options, kwargs) for item in items]
        joined = {name: torch.cat([part[name] for part in parts]) for name in parts[0]}
        from transformers import BatchFeature

        return BatchFeature(joined)

    def _one(self, wave: np.ndarray, options: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        key = (hashlib.blake2b(wave.tobytes(), digest_size=16).digest() + str(wave.size).encode(), options)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self.hits += 1
                return self._entries[key][0]
        value = self._extract(wave, kwargs)
        size = sum(t.numel() * t.element_size() for t in value.values())
        with self._lock:
            self.misses += 1
            if key not in self._entries and size <= self.capacity:
                self._entries[key] = (value, size)
                self.bytes += size
                while self.bytes > self.capacity:
                    _, (_, dropped) = self._entries.popitem(last=False)
                    self.bytes -= dropped
        return value

    def _extract(self, wave: np.ndarray, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The audio's features: over the audio alone (`whisper_features`) once that path gave the
        extractor's exact output for a first audio on this machine, else the extractor's own."""
        short = short_features(self.extractor, wave, kwargs) if self.short_path is not False else None
        if short is None:
            return self._stock(wave, kwargs)
        if self.short_path is None:  # the first: both ways, kept only if equal to the bit
            stock = self._stock(wave, kwargs)
            self.short_path = stock.keys() == short.keys() and all(
                stock[k].dtype == short[k].dtype and torch.equal(stock[k], short[k]) for k in stock
            )
            if not self.short_path:
                log.warning("audio features: the short-window path differs from the extractor here; not used")
            return stock
        self.short_calls += 1
        return short

    def _stock(self, wave: np.ndarray, kwargs: dict[str, Any]) -> dict[str, Any]:
        out = self.extractor([wave], **kwargs)
        return {name: tensor for name, tensor in out.items() if isinstance(tensor, torch.Tensor)}


def cache_audio_features(processor: Any) -> AudioFeatureCache:
    """Put an `AudioFeatureCache` in front of ``processor``'s feature extractor (once)."""
    if not isinstance(processor.feature_extractor, AudioFeatureCache):
        processor.feature_extractor = AudioFeatureCache(processor.feature_extractor)
    return processor.feature_extractor


def _resample(wave: np.ndarray, rate: int) -> np.ndarray:
    """Linear-interpolation fallback; the media layer normally delivers 16 kHz already."""
    if rate == AUDIO_RATE or wave.size == 0:
        return wave.astype(np.float32)
    n = round(wave.size * AUDIO_RATE / rate)
    x = np.linspace(0, wave.size - 1, n)
    return np.interp(x, np.arange(wave.size), wave).astype(np.float32)


@dataclass
class ChatMedia:
    """A request's turns as processor chat messages, with its media in order of appearance."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    audios: list[np.ndarray] = field(default_factory=list)  # 16 kHz mono float32
    images: list[np.ndarray] = field(default_factory=list)
    videos: list[np.ndarray] = field(default_factory=list)
    fps: list[float] = field(default_factory=list)  # per video
    # Per audio (in prompt order): None for an audio of its own, i for the soundtrack of videos[i]
    # (the processor's audio_from_video_indices).
    audio_from_video: list[int | None] = field(default_factory=list)

    @property
    def audio_in_video(self) -> bool:
        return any(i is not None for i in self.audio_from_video)

    def processor_audio_kwargs(self) -> dict[str, Any]:
        """The processor arguments for the audio: the videos' soundtracks interleaved with their
        frames (``load_audio_from_video`` with one decoded audio per slot) when there are any."""
        if not self.audio_in_video:
            return {}
        return {"load_audio_from_video": True, "audio_from_video_indices": list(self.audio_from_video)}


def collect_messages(request: GenerationRequest, *, default_system: str | None) -> ChatMedia:
    """Chat messages with one content part per medium (the processor expands the placeholders);
    ``default_system`` goes first when the request has no system turn (both families use this)."""
    out = ChatMedia()
    if default_system and not any(t.role == "system" for t in request.turns):
        out.messages.append({"role": "system", "content": [{"type": "text", "text": default_system}]})
    for turn in request.turns:
        content: list[dict[str, Any]] = []
        for media in turn.media:
            content.append({"type": media.kind})
            if media.kind == "audio":
                wave = np.asarray(media.data, dtype=np.float32).reshape(-1)
                out.audios.append(_resample(wave, media.sample_rate or AUDIO_RATE))
                out.audio_from_video.append(None)
            elif media.kind == "image":
                out.images.append(np.asarray(media.data, dtype=np.uint8))
            else:
                if media.soundtrack is not None:  # 16 kHz already (media.video.decode_video)
                    out.audios.append(np.asarray(media.soundtrack, dtype=np.float32).reshape(-1))
                    out.audio_from_video.append(len(out.videos))
                out.videos.append(np.asarray(media.data, dtype=np.uint8))
                out.fps.append(float(media.fps or DEFAULT_VIDEO_FPS))
        if turn.text or not content:
            content.append({"type": "text", "text": turn.text})
        out.messages.append({"role": turn.role, "content": content})
    return out


def refuse_placeholders(request: GenerationRequest, names: tuple[str, ...]) -> None:
    """A 400 naming ``messages`` when a turn's text spells one of the model's media placeholders
    (``<|AUDIO|>``...): the tokenizer would read it as the placeholder token, which stands only
    where the processor puts a medium's features; the processor refused it with a ValueError (a
    failed request and a traceback), or it miscounted against the media sent."""
    for turn in request.turns:
        for name in names:
            if name in turn.text:
                raise EngineError(
                    f"a {turn.role} message's text contains {name}, which this model reserves for "
                    "media; remove it (send audio, images and video as content parts)",
                    param="messages",
                )


def video_pixel_bounds(request: GenerationRequest, processor: Any, max_model_len: int) -> dict[str, int]:
    """``stage_params.preprocessing.video_min_pixels`` / ``video_max_pixels`` as the processor's
    ``min_pixels`` / ``max_pixels`` videos kwargs (only those the request sets; both families):
    whole numbers >= 1, the minimum at most the maximum, and the minimum no more than one frame
    of ``max_model_len`` tokens (``processor``'s video patch and merge sizes: the processor would
    upscale every frame to it before the prompt's length is known), else a 400 naming the field
    before the processor sees it."""
    params: dict[str, Any] = dict(request.stage_params.get("preprocessing", {}))
    bounds = {
        key: whole_number(
            params[f"video_{key}"],
            field=f"stage_params.preprocessing.video_{key}",
            least=1,
            what="a whole number of pixels per video frame",
            fix="send an integer such as 200704, or leave it out",
        )
        for key in ("min_pixels", "max_pixels")
        if f"video_{key}" in params
    }
    if bounds.get("min_pixels", 0) > bounds.get("max_pixels", math.inf):
        raise EngineError(
            f"stage_params.preprocessing.video_min_pixels ({bounds['min_pixels']}) must not exceed "
            f"stage_params.preprocessing.video_max_pixels ({bounds['max_pixels']}); lower the minimum "
            "or raise the maximum",
            param="stage_params.preprocessing.video_min_pixels",
        )
    video = processor.video_processor
    token_pixels = (video.patch_size * video.merge_size) ** 2  # a frame's pixels per prompt token
    most = max_model_len * token_pixels
    if bounds.get("min_pixels", 0) > most:
        raise EngineError(
            f"stage_params.preprocessing.video_min_pixels ({bounds['min_pixels']}) would make every "
            f"video frame at least {bounds['min_pixels'] // token_pixels} tokens, more than this "
            f"model's {max_model_len}-token context; send at most {most}",
            param="stage_params.preprocessing.video_min_pixels",
        )
    return bounds


def check_prompt_length(prompt: Prompt, max_model_len: int) -> Prompt:
    """The prompt, or a 400 naming ``messages`` when it (media included) leaves no room to answer."""
    if len(prompt.input_ids) >= max_model_len:
        raise EngineError(
            f"the prompt is {len(prompt.input_ids)} tokens (media included) but this model serves at most "
            f"{max_model_len}; shorten the messages or send smaller media",
            param="messages",
        )
    return prompt


def fit_slots(
    *,
    config: Any,
    device: torch.device,
    dtype: torch.dtype,
    mem_fraction: float | None,
    slots: int,
    max_len: int,
    what: str,
    reserve_bytes: int = 0,
) -> int:
    """Slots whose KV cache fits the GPU budget (--mem-fraction-static of the GPU, 0.9 if unset),
    after ``reserve_bytes`` more for what lives beside the slots (the thinker's kept session KV)."""
    if device.type != "cuda":
        return slots
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_slot = 2 * config.num_hidden_layers * config.num_key_value_heads * max_len * head_dim * itemsize
    free, total = torch.cuda.mem_get_info(device)
    fraction = mem_fraction or 0.9
    budget = fraction * total - (total - free) - KV_RESERVE_BYTES - reserve_bytes
    fit = int(budget // per_slot)
    if fit < 1:
        raise EngineError(
            f"the {what} KV cache needs {per_slot / 1e9:.2f} GB per request ({max_len} tokens) but only "
            f"{max(budget, 0) / 1e9:.2f} GB of {fraction:g} x {total / 1e9:.0f} GB is left on {device} after the "
            f"weights{' and --session-kv-mb' if reserve_bytes else ''}; lower --max-model-len"
            f"{' or --session-kv-mb' if reserve_bytes else ''} or raise --mem-fraction-static",
            param="mem_fraction_static",
        )
    if fit < slots:
        log.warning("%s: %d slots fit in the memory budget (asked for %d)", what, fit, slots)
    return min(slots, fit)


def thinker_slots(adapter: Any, *, slots: int, max_len: int) -> int:
    """This process's thinker KV slots (its rank's heads under TP), with the kept session KV
    reserved beside them. Both families' adapters, and a TP follower for its own GPU."""
    from omni_runtime.executor.tensor_parallel import sharded_thinker_config

    text = sharded_thinker_config(adapter.loaded.config.thinker_config, adapter.tp_world).text_config
    return fit_slots(
        config=text,
        device=adapter.placement.thinker,
        dtype=adapter.placement.dtype,
        mem_fraction=adapter.mem_fraction,
        slots=slots,
        max_len=max_len,
        what="thinker",
        reserve_bytes=adapter.session_kv_bytes,
    )


def thinker_runner(adapter: Any, *, slots: int, max_len: int) -> Any:
    """The adapter's thinker runner over the slots that fit; under TP (``adapter.loaded.tp``, a
    tp_group.TPLeader) after every rank agreed on the slot count, wrapped so each decoder op
    reaches the followers."""
    fit = thinker_slots(adapter, slots=slots, max_len=max_len)
    leader = adapter.loaded.tp
    if leader is None:
        return adapter.build_thinker_runner(slots=fit, max_len=max_len)
    from omni_runtime.executor.tp_runner import TPThinkerRunner

    agreed = leader.agree_slots(fit, max_len)
    return TPThinkerRunner(adapter.build_thinker_runner(slots=agreed, max_len=max_len), leader)


def sync_stream(device: torch.device) -> None:
    """Finish this thread's stream before its outputs go to a stage on another stream."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def joined_audio_frames(
    batch: list[dict[str, Any]], *, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of audio-encoder items as the towers take them: every item's valid feature frames
    joined along time [mel, T] (items differ in length: an encoder-cache unit is cut to its audio's
    valid frames, and requests batch together) and each audio's frame count."""
    flat = torch.cat(
        [
            b["input_features"].permute(0, 2, 1)[b["feature_attention_mask"].bool()].permute(1, 0)
            for b in batch
        ],
        dim=1,
    ).to(device, dtype)
    lengths = torch.cat([b["feature_attention_mask"].sum(-1) for b in batch]).to(device)
    return flat, lengths


def per_request(per_audio: tuple[torch.Tensor, ...], batch: list[dict[str, Any]]) -> list[torch.Tensor]:
    """The audio tower's per-audio outputs joined back per request (each item holds
    ``feature_attention_mask.shape[0]`` audios, in order)."""
    results, start = [], 0
    for item in batch:
        count = item["feature_attention_mask"].shape[0]
        results.append(torch.cat(per_audio[start : start + count]))
        start += count
    return results


def rope_context(prompt: Prompt) -> dict[str, Any]:
    """The media geometry rope indexing needs (CPU tensors): audio lengths, image and video grids."""
    context: dict[str, Any] = {}
    if prompt.audio is not None:
        context["audio_feature_lengths"] = prompt.audio["feature_attention_mask"].sum(-1)
    if prompt.images is not None:
        context["image_grid_thw"] = prompt.images["image_grid_thw"]
    if prompt.videos is not None:
        context["video_grid_thw"] = prompt.videos["video_grid_thw"]
        context["video_second_per_grid"] = prompt.videos["video_second_per_grid"]
    if prompt.audio_in_video:
        context[AUDIO_IN_VIDEO] = torch.tensor(True)  # a tensor: the context crosses stage links
    return context


AUDIO_IN_VIDEO = "use_audio_in_video"


def audio_in_video(context: dict[str, Any]) -> bool:
    """Whether the prompt's video tokens interleave their soundtrack's (get_rope_index's flag)."""
    return bool(context.get(AUDIO_IN_VIDEO, False))


def text_only_ids(processor: Any, text: str) -> list[int]:
    """A prompt without media as token ids straight from the tokenizer: what the processor gives
    for it, in a third of the time (the processor's keyword merging is most of its cost, paid per
    request on a thread that shares the interpreter with busy stage threads). The text names no
    media placeholder: `refuse_placeholders` has refused those."""
    ids: list[int] = processor.tokenizer(text)["input_ids"]
    return ids


def placeholder_mask(ids: torch.Tensor, token: int, features: Any) -> torch.Tensor | None:
    """Where ``token`` stands in ``ids`` (None: nowhere), checked against the encoder's output rows.
    Given the prompt's ids on the CPU, as the adapters do, it needs no device sync (on a GPU each
    one waited for a kernel of the aggregation's low-priority stream behind the talker's and the
    vocoder's)."""
    mask = ids == token
    count = int(mask.sum())
    if count == 0:
        return None
    got = 0 if features is None else int(features.shape[0])
    if got != count:
        raise EngineError(f"media placeholders ({count}) and encoder outputs ({got}) disagree", status=500)
    return mask


class SingleWindow:
    """A vocoder's ``synthesize``: one window, as one item of its ``synthesize_many`` (both families)."""

    def synthesize_many(self, items: list[dict[str, Any]]) -> list[np.ndarray]:
        raise NotImplementedError

    def synthesize(
        self,
        codes: list[Any],
        *,
        start: int,
        end: int,
        ctx_start: int,
        ctx_end: int,
        voice: str,
        seed: int,
        reusable: bool = False,
    ) -> np.ndarray:
        """Audio of ``codes[start:end]``, synthesised over ``codes[ctx_start:ctx_end]``; ``reusable``
        windows (a size that recurs) may run as a captured CUDA graph."""
        window = {"start": start, "end": end, "ctx_start": ctx_start, "ctx_end": ctx_end}
        item = {"codes": codes, "window": window, "voice": voice, "seed": seed, "reusable": reusable}
        return self.synthesize_many([item])[0]
