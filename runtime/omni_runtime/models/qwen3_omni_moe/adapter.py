"""The Qwen3-Omni-MoE adapter: the thinker-side stages of Qwen3-Omni-30B-A3B, one stage at a time.

preprocessing runs ``Qwen3OmniMoeProcessor`` (chat template, 16 kHz audio features, image and
video patches), audio_encoder the thinker's audio tower, image_encoder its vision tower (merged
patches plus DeepStack features), mm_aggregate the token embeddings with media scattered at
their placeholders plus the interleaved 3D mrope positions of ``get_rope_index``, and the thinker is
the MoE text model driven through the runtime's slot KV cache and batched sampler
(executor/slot_cache.py, via the Qwen2.5 thinker runner: both families' decoder layers take the
same cache and rotary inputs). Its MoE blocks use transformers' grouped_mm experts kernel
(loader.py).

Speech: the talker stage runs the MoE talker with its code predictor (talker.py: a frame of
``num_code_groups`` codes per step, batched in slots) and Code2Wav over windows of frames with
left context (code2wav.py); ``codec_windows`` sizes those windows for 12.5 frames a second.

A video's soundtrack, when the request puts the audio in the video, is one of the prompt's audios
and the processor interleaves its tokens with the video's by time (``Prompt.audio_in_video``;
get_rope_index is told so, here and in the talker).

With --thinker-tp-size N the thinker is sharded over N GPUs as Qwen2.5's is (executor/
tensor_parallel: attention heads, and every expert's channels with the router replicated), rank 0
here and followers in their own processes (tp_group); DeepStack features reach every rank.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from omni_runtime.contract.adapter import OmniAdapter, Prompt, ThinkerPrompt, ThinkerRunner
from omni_runtime.contract.engine import EngineError, GenerationRequest
from omni_runtime.contract.options import EngineOptions
from omni_runtime.executor.tensor_parallel import sharded_thinker_config
from omni_runtime.models.common import (
    DEFAULT_VIDEO_FPS,
    audio_in_video,
    check_prompt_length,
    collect_messages,
    fit_slots,
    joined_audio_frames,
    per_request,
    placeholder_mask,
    refuse_placeholders,
    rope_context,
    sync_stream,
    text_only_ids,
    thinker_runner,
    video_pixel_bounds,
)
from omni_runtime.models.qwen2_5_omni.placement import stage_stream_initializer
from omni_runtime.models.qwen3_omni_moe.code2wav import Qwen3Code2Wav
from omni_runtime.models.qwen3_omni_moe.loader import LoadedQwen3
from omni_runtime.models.qwen3_omni_moe.runners import DEEPSTACK, Qwen3ThinkerRunner
from omni_runtime.models.qwen3_omni_moe.talker import Qwen3TalkerRunner

# Code2Wav windows in frames (80 ms each): the first audio after 3 + 1 frames, then 1.2 s windows,
# each with 25 frames of left context (as chunked_decode) and the one frame after it that the
# transposed convolutions' last samples need. A first window of 3 frames, not 4, gave first audio
# about 65 ms sooner on an H200 (docs/benchmarks.md) once a frame took one graph replay; the ramp
# keeps each window's making shorter than the audio before it plays.
CODEC_WINDOWS: dict[str, Any] = {
    "first_chunk": 3,
    "ramp": (6, 9, 12),  # 0.24 s, then 0.48, 0.72, 0.96 s of audio before the steady 1.2 s windows
    "chunk": 15,
    "left_context": 25,
    "right_context": 1,
}


def _at_least(audio: Any, samples: int) -> Any:
    """``audio`` zero-padded to ``samples``. Qwen3's processor pads audio only to the longest of
    the request (Qwen2.5's to 30 s), and its STFT reflects ``n_fft / 2`` samples at each end, so
    a clip shorter than that (a 10 ms chunk on the video socket) would fail there."""
    short = samples - len(audio)
    return np.pad(audio, (0, short)) if short > 0 else audio


class Qwen3OmniMoeAdapter(OmniAdapter):
    def __init__(self, loaded: LoadedQwen3, *, options: EngineOptions, hosted: frozenset[str]) -> None:
        self.loaded = loaded
        self.hosted = hosted
        self.placement = loaded.placement
        self.model_name = options.model_name or loaded.path.name
        self.max_model_len = options.max_model_len
        self.output_sample_rate = 24000
        self.supports_audio_output = loaded.talker is not None
        self.eos_token_ids = loaded.eos_token_ids
        speakers = getattr(loaded.config.talker_config, "speaker_id", None) or {}
        self.voices = tuple(str(name).capitalize() for name in sorted(speakers, key=speakers.__getitem__))
        self.default_voice = "Ethan" if "Ethan" in self.voices else (self.voices[0] if self.voices else None)
        self.codec_windows = dict(CODEC_WINDOWS)
        self.codes_per_second = 12.5  # one frame of every codebook per 80 ms
        self.mem_fraction = options.mem_fraction_static
        self.session_kv_bytes = options.session_kv_mb << 20  # kept session KV beside the slots
        cfg = loaded.config.thinker_config
        self.audio_token, self.image_token, self.video_token = (
            cfg.audio_token_id,
            cfg.image_token_id,
            cfg.video_token_id,
        )
        self._placeholder_names = tuple(
            self.tokenizer.convert_ids_to_tokens([self.audio_token, self.image_token, self.video_token])
        )

    @property
    def tokenizer(self) -> Any:
        return self.loaded.processor.tokenizer

    # -- preprocessing (CPU) -------------------------------------------------------------------
    def preprocess(self, request: GenerationRequest) -> Prompt:
        refuse_placeholders(request, self._placeholder_names)
        pixel_bounds = video_pixel_bounds(request, self.loaded.processor, self.max_model_len)
        media = collect_messages(request, default_system=None)
        proc = self.loaded.processor
        text = proc.apply_chat_template(media.messages, add_generation_prompt=True, tokenize=False)
        if not (media.audios or media.images or media.videos):
            return check_prompt_length(Prompt(input_ids=text_only_ids(proc, text)), self.max_model_len)
        fps = media.fps[0] if media.fps else DEFAULT_VIDEO_FPS
        out = proc(
            text=[text],
            audio=[_at_least(a, proc.feature_extractor.n_fft) for a in media.audios] or None,
            images=media.images or None,
            videos=media.videos or None,
            return_tensors="pt",
            videos_kwargs={"fps": fps, **pixel_bounds},
            **media.processor_audio_kwargs(),
        )
        prompt = Prompt(input_ids=out["input_ids"][0].tolist(), audio_in_video=media.audio_in_video)
        if media.audios:
            prompt.audio = {
                "input_features": out["input_features"],
                "feature_attention_mask": out["feature_attention_mask"],
            }
        if media.images:
            prompt.images = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
        if media.videos:
            prompt.videos = {
                "pixel_values_videos": out["pixel_values_videos"],
                "video_grid_thw": out["video_grid_thw"],
                "video_second_per_grid": torch.as_tensor(out["video_second_per_grid"], dtype=torch.float32),
            }
        return check_prompt_length(prompt, self.max_model_len)

    # -- encoders ------------------------------------------------------------------------------
    @torch.inference_mode()
    def encode_audio(self, batch: list[dict[str, Any]]) -> list[Any]:
        """Every audio of every request through the audio tower in one call (as get_audio_features)."""
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            _get_feat_extract_output_lengths,
        )

        tower = self.loaded.audio_tower
        device = self.placement.audio
        flat, lengths = joined_audio_frames(batch, device=device, dtype=self.placement.dtype)
        out = tower(flat, feature_lens=lengths).last_hidden_state
        per_audio = torch.split(out, _get_feat_extract_output_lengths(lengths).tolist())
        results = per_request(per_audio, batch)
        sync_stream(device)
        return results

    @torch.inference_mode()
    def encode_vision(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every image and video of every request through the vision tower in one call.

        Each medium's output is its merged patch embeddings [n, H] with its DeepStack features
        appended along the last axis ([n, H * (1 + k)]), so the encoder cache keeps them together.
        """
        visual = self.loaded.visual
        pixels, grids, owners = [], [], []
        for i, item in enumerate(batch):
            for key, grid_key, kind in (
                ("pixel_values", "image_grid_thw", "image"),
                ("pixel_values_videos", "video_grid_thw", "video"),
            ):
                if item.get(key) is not None:
                    pixels.append(item[key])
                    grids.append(item[grid_key])
                    owners += [(i, kind)] * item[grid_key].shape[0]
        device = self.placement.vision
        grid = torch.cat(grids)
        out = visual(torch.cat(pixels).to(device, self.placement.dtype), grid_thw=grid.to(device))
        joined = torch.cat([out.pooler_output, *out.deepstack_features], dim=-1)
        sizes = (grid.prod(-1) // visual.spatial_merge_size**2).tolist()
        results: list[dict[str, list[Any]]] = [{"image": [], "video": []} for _ in batch]
        for (owner, kind), part in zip(owners, torch.split(joined, sizes), strict=True):
            results[owner][kind].append(part)
        sync_stream(device)
        return [{k: (torch.cat(v) if v else None) for k, v in r.items()} for r in results]

    @property
    def video_groups_independent(self) -> bool:
        """Qwen3-Omni's vision tower attends within each temporal patch group (cu_seqlens per grid
        t; its position embeddings and rotary positions are spatial, repeated over t), so a video's
        groups encode apart exactly: a streaming session's frame pairs are its video's groups."""
        return True

    # -- mm_aggregate ----------------------------------------------------------------------------
    @torch.inference_mode()
    def aggregate(self, prompt: Prompt, *, audio: Any, image: Any, video: Any) -> ThinkerPrompt:
        device = self.placement.thinker
        ids = torch.tensor(prompt.input_ids)  # on the CPU: the placeholders are found without a sync
        embeds = self.loaded.embed(ids.to(device))
        hidden = embeds.shape[-1]
        deep_positions, deep_features = [], []
        for token, features in (
            (self.audio_token, audio),
            (self.image_token, image),
            (self.video_token, video),
        ):
            mask = placeholder_mask(ids, token, features)
            if mask is None:
                continue
            count = int(mask.sum())
            features = features.to(device, embeds.dtype)
            embeds[mask.to(device)] = features[:, :hidden]
            if token != self.audio_token:  # vision: the DeepStack features ride behind the embedding
                deep_positions.append(mask.nonzero()[:, 0].to(device))
                deep_features.append(features[:, hidden:].reshape(count, -1, hidden))
        context = rope_context(prompt)
        positions, delta = self.loaded.rope.get_rope_index(
            ids[None],
            context.get("image_grid_thw"),
            context.get("video_grid_thw"),
            torch.ones(1, len(prompt.input_ids), dtype=torch.long),
            audio_in_video(context),
            context.get("audio_feature_lengths"),
            context.get("video_second_per_grid"),
        )
        if deep_features:
            context[DEEPSTACK] = (torch.cat(deep_positions), torch.cat(deep_features))
        sync_stream(device)
        return ThinkerPrompt(
            input_ids=prompt.input_ids,
            embeds=embeds,
            positions=positions[:, 0],
            rope_delta=int(delta.reshape(-1)[0]),
            talker_context=context,
        )

    # -- runners -------------------------------------------------------------------------------
    def _fit_slots(self, config: Any, device: torch.device, slots: int, max_len: int, what: str) -> int:
        return fit_slots(
            config=config,
            device=device,
            dtype=self.placement.dtype,
            mem_fraction=self.mem_fraction,
            slots=slots,
            max_len=max_len,
            what=what,
        )

    @property
    def tp_world(self) -> int:
        return self.loaded.tp_world

    def thinker_runner(self, *, slots: int, max_len: int) -> ThinkerRunner:
        """The thinker runner; under TP, rank 0's, after all ranks agreed on the slot count."""
        return thinker_runner(self, slots=slots, max_len=max_len)  # type: ignore[no-any-return]

    def build_thinker_runner(self, *, slots: int, max_len: int) -> Qwen3ThinkerRunner:
        """A runner over this process's thinker (its shard under TP), with exactly ``slots`` slots."""
        cfg = sharded_thinker_config(self.loaded.config.thinker_config, self.tp_world)
        # The runner reads the Qwen2.5 names of the media token ids (for talker vectors).
        names = SimpleNamespace(
            text_config=cfg.text_config,
            audio_token_index=self.audio_token,
            image_token_index=self.image_token,
            video_token_index=self.video_token,
        )
        return Qwen3ThinkerRunner(
            self.loaded.text,
            self.loaded.lm_head,
            names,
            slots=slots,
            max_len=max_len,
            dtype=self.placement.dtype,
            device=self.placement.thinker,
            cuda_graphs=self.placement.cuda_graphs,
            decodable_vocab=len(self.tokenizer),
            accept_layer=int(self.loaded.config.talker_config.accept_hidden_layer),
            decode_layer=None if self.tp_world == 1 else "off",  # a shard's layers stay as they are
        )

    def talker_runner(self, *, slots: int, max_len: int) -> Qwen3TalkerRunner:
        loaded = self.loaded
        if loaded.talker is None or loaded.text_vectors is None:
            raise EngineError("this worker has no talker loaded", param="modalities")
        slots = self._fit_slots(
            loaded.config.talker_config.text_config, self.placement.talker, slots, max_len, "talker"
        )
        return Qwen3TalkerRunner(
            loaded.talker,
            config=loaded.config,
            text_vectors=loaded.text_vectors,
            slots=slots,
            max_len=max_len,
            dtype=self.placement.dtype,
            device=self.placement.talker,
            cuda_graphs=self.placement.cuda_graphs,
        )

    def vocoder(self) -> Qwen3Code2Wav:
        if self.loaded.code2wav is None:
            raise EngineError("this worker has no Code2Wav loaded", param="modalities")
        return Qwen3Code2Wav(
            self.loaded.code2wav, device=self.placement.talker, cuda_graphs=self.placement.cuda_graphs
        )

    def thread_initializer(self, stage: str) -> Any:
        return stage_stream_initializer(self.placement, stage)

    def talker_sampling_defaults(self) -> dict[str, Any]:
        # The released generate() defaults for the talker.
        return {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05}
