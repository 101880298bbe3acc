"""The Qwen2.5-Omni adapter: the model's submodules, driven one stage at a time.

Instead of the monolithic ``generate``, each stage calls exactly the submodule it owns:
preprocessing (processor: chat template, 16 kHz audio features, image/video patches),
audio_encoder (the thinker's audio tower), image_encoder (its vision tower, for images
and videos), mm_aggregate (token embeddings with media scattered at their placeholders plus 3D
mrope positions from ``get_rope_index``), thinker and talker (runners.py) and the vocoder
(vocoder.py). Encoders take the inputs of several requests in one call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omni_runtime.contract import switches
from omni_runtime.contract.adapter import OmniAdapter, Prompt, ThinkerPrompt, ThinkerRunner
from omni_runtime.contract.engine import EngineError, GenerationRequest
from omni_runtime.contract.options import EngineOptions
from omni_runtime.executor.tensor_parallel import sharded_thinker_config
from omni_runtime.models.common import (
    DEFAULT_VIDEO_FPS,
    audio_in_video,
    cache_audio_features,
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
from omni_runtime.models.qwen2_5_omni.placement import LoadedModel, stage_stream_initializer
from omni_runtime.models.qwen2_5_omni.runners import QwenTalkerRunner, QwenThinkerRunner
from omni_runtime.models.qwen2_5_omni.vocoder import QwenVocoder

# The system prompt the released model was trained with; it asks for speech-capable answers.
DEFAULT_SYSTEM_PROMPT = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving "
    "auditory and visual inputs, as well as generating text and speech."
)


# Streaming windows, in codes (50 a second): a first window of 10 (0.2 s of audio), then 10, 20,
# 30, then the steady 40. A first window of 5 came 25-40 ms sooner on an H100 but left the listener
# waiting about 0.12 s for the second even with one stream (docs/benchmarks.md, "First window and
# thinker holds"); 10 covers the second window's making at one stream. From 4 streaming replies on,
# the first window holds 20 codes (0.4 s): on an H100 at 4, 8 and 16 streams the second window's
# codes and its batched vocoder call took about 0.3 s, and with 10 every stream stalled there for
# 0.1-0.25 s; with 20, 15 of 16 and 15 of 32 streams played without a stall, for 0.09-0.11 s more
# first-audio latency (docs/benchmarks.md, "A longer first window under load"). After a busy first
# window two windows of 10: the third window's codes come at the thinker's text rate, and with one
# window of 10 then 20 at 16 streams it stalled up to 0.17-0.22 s; with 10, 10 at most 0.04 s
# (two H100 calls, "The third window under load"). Since a wave's first windows share one vocoder
# call, the busy first window is 22 codes (0.44 s): with 20, the bulk of a 16-stream wave had 6-20 ms
# of audio left when its second window came and one run in two stalled there; 22 gave it 40-60 ms
# more (48/48 and 32/32 streams real time at 16 through HTTP, against 32/48 and 15/32) for 15-30 ms
# more first audio ("The second window's margin: a busy first window of 22 codes").
# OMNI_BUSY_STREAMS=N moves the threshold; 0 keeps 10 at any load.
CODEC_WINDOWS = {
    "first_chunk": 10,
    "ramp": (10, 20, 30),
    "first_chunk_busy": 22,
    "busy_streams": 4,
    "ramp_busy": (10, 10, 20, 30),
}


class Qwen25OmniAdapter(OmniAdapter):
    def __init__(self, loaded: LoadedModel, *, options: EngineOptions, hosted: frozenset[str]) -> None:
        self.loaded = loaded
        self.hosted = hosted
        self.placement = loaded.placement
        path: Path | None = loaded.path
        self.model_name = options.model_name or (path.name if path is not None else "qwen2.5-omni-dummy")
        self.max_model_len = options.max_model_len
        self.output_sample_rate = 24000
        self.supports_audio_output = loaded.talker is not None
        self.eos_token_ids = loaded.eos_token_ids
        self.voices = tuple(loaded.speakers)
        self.default_voice = (
            "Chelsie" if "Chelsie" in self.voices else (self.voices[0] if self.voices else None)
        )
        self._processor = loaded.processor
        # A conversation resends every earlier turn's audio: each one's features are extracted once.
        self.audio_features = cache_audio_features(self._processor)
        self.mem_fraction = options.mem_fraction_static
        # 50 codes a second: the first window plays 0.1 s, so the next ones grow (0.2, 0.4, 0.6 s)
        # before the steady 0.8 s windows, each made while the previous one plays.
        self.codec_windows = dict(CODEC_WINDOWS)
        # Kept session KV sits beside the thinker's slots (under TP: each rank's shard of it).
        self.session_kv_bytes = options.session_kv_mb << 20
        cfg = loaded.config.thinker_config
        self.audio_token, self.image_token, self.video_token = (
            cfg.audio_token_index,
            cfg.image_token_index,
            cfg.video_token_index,
        )
        self._placeholder_names = tuple(
            self.tokenizer.convert_ids_to_tokens([self.audio_token, self.image_token, self.video_token])
        )

    @property
    def tokenizer(self) -> Any:
        return self._processor.tokenizer

    # -- preprocessing (CPU) -------------------------------------------------------------------
    def preprocess(self, request: GenerationRequest) -> Prompt:
        refuse_placeholders(request, self._placeholder_names)
        pixel_bounds = video_pixel_bounds(request, self.loaded.processor, self.max_model_len)
        media = collect_messages(request, default_system=DEFAULT_SYSTEM_PROMPT)
        messages, audios, images, videos, fps = (
            media.messages,
            media.audios,
            media.images,
            media.videos,
            media.fps,
        )
        proc = self._processor
        text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        if not (audios or images or videos):
            return check_prompt_length(Prompt(input_ids=text_only_ids(proc, text)), self.max_model_len)
        video_kwargs: dict[str, Any] = {
            "fps": fps[0] if fps else DEFAULT_VIDEO_FPS,
            "cap_pixels_per_frame": True,
            **pixel_bounds,
        }
        out = proc(
            text=[text],
            audio=audios or None,
            images=images or None,
            videos=videos or None,
            return_tensors="pt",
            videos_kwargs=video_kwargs,
            **media.processor_audio_kwargs(),
        )
        prompt = Prompt(input_ids=out["input_ids"][0].tolist(), audio_in_video=media.audio_in_video)
        if audios:
            prompt.audio = {
                "input_features": out["input_features"],
                "feature_attention_mask": out["feature_attention_mask"],
            }
        if images:
            prompt.images = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
        if videos:
            temporal = proc.video_processor.temporal_patch_size
            prompt.videos = {
                "pixel_values_videos": out["pixel_values_videos"],
                "video_grid_thw": out["video_grid_thw"],
                "video_second_per_grid": torch.tensor([temporal / f for f in fps]),
            }
        return check_prompt_length(prompt, self.max_model_len)

    # -- encoders ------------------------------------------------------------------------------
    @torch.inference_mode()
    def encode_audio(self, batch: list[dict[str, Any]]) -> list[Any]:
        """Every audio of every request through the audio tower in one call (as get_audio_features)."""
        tower = self.loaded.audio_tower
        device = self.placement.audio
        flat, lengths = joined_audio_frames(batch, device=device, dtype=self.placement.dtype)
        after_cnn, out_lengths = tower._get_feat_extract_output_lengths(lengths)
        out = tower(flat, feature_lens=lengths, aftercnn_lens=after_cnn).last_hidden_state
        per_audio = torch.split(out, out_lengths.tolist())
        results = per_request(per_audio, batch)
        sync_stream(device)
        return results

    @torch.inference_mode()
    def encode_vision(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every image and video of every request through the vision tower in one call."""
        visual = self.loaded.visual
        if visual is None:  # LocalStages sends image_encoder calls to that process instead
            raise EngineError(
                f"the image encoder runs in the stage process at {self.vision_stage_address}", status=500
            )
        pixels, grids, owners = [], [], []
        for i, item in enumerate(batch):
            if item.get("pixel_values") is not None:
                pixels.append(item["pixel_values"])
                grids.append(item["image_grid_thw"])
                owners += [(i, "image")] * item["image_grid_thw"].shape[0]
            if item.get("pixel_values_videos") is not None:
                pixels.append(item["pixel_values_videos"])
                grids.append(item["video_grid_thw"])
                owners += [(i, "video")] * item["video_grid_thw"].shape[0]
        device = self.placement.vision
        grid = torch.cat(grids)
        merged = visual(torch.cat(pixels).to(device, visual.dtype), grid_thw=grid.to(device)).pooler_output
        sizes = (grid.prod(-1) // visual.spatial_merge_size**2).tolist()
        results: list[dict[str, list[Any]]] = [{"image": [], "video": []} for _ in batch]
        for (owner, kind), part in zip(owners, torch.split(merged, sizes), strict=True):
            results[owner][kind].append(part)
        out = [{k: (torch.cat(v) if v else None) for k, v in r.items()} for r in results]
        sync_stream(device)
        return out

    @property
    def vision_stage_address(self) -> str | None:
        """host:port of the image-encoder stage process when image-encoder TP runs there."""
        child = self.loaded.vision_stage
        return None if child is None else str(child.address)

    @property
    def audio_chunk_frames(self) -> int | None:
        """Qwen2.5's audio tower cuts the features into chunks of ``2 * n_window`` frames and runs
        its convolutions, positions and attention (``cu_seqlens``) per chunk; a full chunk has an
        even length after the CNN, so the stride-2 pooling never pairs across chunks."""
        tower = self.loaded.audio_tower
        return None if tower is None else 2 * int(tower.n_window)

    @property
    def video_groups_independent(self) -> bool:
        """Qwen2.5's vision tower attends within each temporal patch group (its cu_seqlens split
        per grid t, its rotary positions are spatial), so a video's groups encode apart exactly."""
        return True

    def close_vision(self) -> None:
        """Stop the image-encoder TP followers or stage process, if any (idempotent)."""
        for part in (self.loaded.vision_tp, self.loaded.vision_stage):
            if part is not None:
                part.close()

    # -- mm_aggregate ----------------------------------------------------------------------------
    @torch.inference_mode()
    def aggregate(self, prompt: Prompt, *, audio: Any, image: Any, video: Any) -> ThinkerPrompt:
        device = self.placement.thinker
        ids = torch.tensor(prompt.input_ids)  # on the CPU: the placeholders are found without a sync
        embeds = self.loaded.embed(ids.to(device))
        for token, features in (
            (self.audio_token, audio),
            (self.image_token, image),
            (self.video_token, video),
        ):
            mask = placeholder_mask(ids, token, features)
            if mask is None:
                continue
            embeds[mask.to(device)] = features.to(device, embeds.dtype)
        context = self.talker_context(prompt)
        positions, delta = self.loaded.rope.get_rope_index(
            ids[None],
            context.get("image_grid_thw"),
            context.get("video_grid_thw"),
            torch.ones(1, len(prompt.input_ids), dtype=torch.long),
            audio_in_video(context),
            context.get("audio_feature_lengths"),
            context.get("video_second_per_grid"),
        )
        sync_stream(device)
        return ThinkerPrompt(
            input_ids=prompt.input_ids,
            embeds=embeds,
            positions=positions[:, 0],
            rope_delta=int(delta.reshape(-1)[0]),
            talker_context=context,
        )

    # The media geometry rope indexing needs (CPU tensors), for the thinker and the talker.
    talker_context = staticmethod(rope_context)

    # -- runners -------------------------------------------------------------------------------
    def _fit_slots(
        self,
        *,
        config: Any,
        device: torch.device,
        slots: int,
        max_len: int,
        what: str,
        reserve_bytes: int = 0,
    ) -> int:
        return fit_slots(
            config=config,
            device=device,
            dtype=self.placement.dtype,
            mem_fraction=self.mem_fraction,
            slots=slots,
            max_len=max_len,
            what=what,
            reserve_bytes=reserve_bytes,
        )

    @property
    def tp_world(self) -> int:
        return self.loaded.tp_world

    def thinker_runner(self, *, slots: int, max_len: int) -> ThinkerRunner:
        """The thinker runner; under TP, rank 0's, after all ranks agreed on the slot count."""
        return thinker_runner(self, slots=slots, max_len=max_len)  # type: ignore[no-any-return]

    def build_thinker_runner(self, *, slots: int, max_len: int) -> QwenThinkerRunner:
        """A runner over this process's thinker (its shard under TP), with exactly ``slots`` slots."""
        return QwenThinkerRunner(
            self.loaded.text,
            self.loaded.lm_head,
            sharded_thinker_config(self.loaded.config.thinker_config, self.tp_world),
            slots=slots,
            max_len=max_len,
            dtype=self.placement.dtype,
            device=self.placement.thinker,
            cuda_graphs=self.placement.cuda_graphs,
            decodable_vocab=len(self.tokenizer),
        )

    def talker_runner(self, *, slots: int, max_len: int) -> QwenTalkerRunner:
        if self.loaded.talker is None:
            raise EngineError("this worker has no talker loaded", param="modalities")
        slots = self._fit_slots(
            config=self.loaded.config.talker_config,
            device=self.placement.talker,
            slots=slots,
            max_len=max_len,
            what="talker",
            reserve_bytes=self.session_kv_bytes,  # the talker's kept prompt KV (pipeline/talker.py)
        )
        return QwenTalkerRunner(
            self.loaded.talker,
            text_vectors=self.loaded.text_vectors,
            speakers=self.loaded.speakers,
            slots=slots,
            max_len=max_len,
            dtype=self.placement.dtype,
            device=self.placement.talker,
            cuda_graphs=self.placement.cuda_graphs,
        )

    def vocoder(self) -> QwenVocoder:
        if self.loaded.token2wav is None:
            raise EngineError("this worker has no vocoder loaded", param="modalities")
        on_gpu = self.placement.talker.type == "cuda"
        try:
            precision = switches.choice("OMNI_VOCODER_DTYPE", "bfloat16" if on_gpu else "float32")
        except ValueError as exc:
            raise EngineError(str(exc), param="OMNI_VOCODER_DTYPE") from None
        return QwenVocoder(
            self.loaded.token2wav,
            speakers=self.loaded.speakers,
            device=self.placement.talker,
            cuda_graphs=self.placement.cuda_graphs,
            dit_dtype=getattr(torch, precision),
        )

    def thread_initializer(self, stage: str) -> Any:
        return stage_stream_initializer(self.placement, stage)

    @property
    def captures_cuda_graphs(self) -> bool:
        return bool(self.placement.cuda_graphs)

    @property
    def vocoder_shares_thinker_device(self) -> bool:
        """A GPU shared by the thinker and the vocoder (where the thinker's GEMMs delay the
        vocoder's many small kernels; CPU threads share cores differently)."""
        return self.placement.talker == self.placement.thinker and self.placement.thinker.type == "cuda"

    def talker_sampling_defaults(self) -> dict[str, Any]:
        # The released generate() defaults for the talker.
        return {"temperature": 0.9, "top_k": 40, "top_p": 0.8, "repetition_penalty": 1.05}
