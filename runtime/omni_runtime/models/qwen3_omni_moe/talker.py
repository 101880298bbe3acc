"""Qwen3-Omni-MoE's talker and code predictor as one continuously batched decoder: a frame per step.

Each step of ``Qwen3OmniMoeTalkerForConditionalGeneration`` makes one codec frame of
``num_code_groups`` codes: the MoE talker samples the first codebook from its ``codec_head``; the
code predictor (a small dense decoder) then runs ``num_code_groups - 1`` steps of its own over
[talker hidden state, first code's embedding], drawing codebook k from ``lm_head[k-1]``. The
next talker input is the sum of the frame's codec embeddings plus the next text vector. This
runner does what transformers' ``generate`` does, per request and incrementally, with the
talker's KV cache in runtime slots (executor/slot_cache.py, as for the thinker):

- the prompt (talker_prompt.py): the user turns, text positions through ``text_projection`` of
  the thinker's input embedding, media positions through ``hidden_projection`` of its hidden
  state after ``accept_hidden_layer``; then the assistant header, 4 ``tts_pad``, ``tts_bos`` and
  the first reply token (``text_projection``), summed with the codec think/speaker/pad/BOS
  embeddings; rope positions as ``get_rope_index`` gives them for those ids;
- decode step g adds ``text_projection`` of reply token g+1's embedding, then ``tts_eos`` once,
  then ``tts_pad``; the codec ids transformers suppresses (the top 1024 but EOS) are never drawn;
- the frame of a first code is completed in the same call that draws it (generate completes it
  at the next step), so a frame leaves a step earlier; the arithmetic is the same.

The code predictor runs on the runtime's slot decoder too: its 16 positions per frame ([talker
hidden, first code], then one per further codebook) are 16 single-token steps over a 16-long slot
cache. On a GPU the whole frame (those 16 steps, the 15 per-codebook heads, the draws and the
codec embeddings) is **one CUDA graph per batch bucket** (``_frame``): one replay per frame, not
16 replays and some 150 eager launches between them, which had made a frame cost about 26 ms at
one stream, most of it launch overhead. The draws use the sampler's host-free path
(``BatchSampler.sample_dense``), so the graph needs no host round trip until the frame's codes
are read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from omni_runtime.contract.adapter import RowSampling, TalkerAdmission
from omni_runtime.contract.engine import EngineError
from omni_runtime.executor.host_copy import to_device
from omni_runtime.executor.sampling import BatchSampler
from omni_runtime.executor.slot_cache import SlotDecoder, prefill_after_kept
from omni_runtime.models.qwen3_omni_moe.talker_prompt import (
    ASSISTANT_HEADER,
    TurnTokens,
    assistant_start,
    talker_prompt_ids,
    user_positions,
)

log = logging.getLogger(__name__)

SUPPRESSED_TOP = 1024  # generate never lets the talker draw its top 1024 ids (special codec ids) but EOS
PREDICTOR_TOP_K, PREDICTOR_TOP_P = 50, 0.8  # generate's code-predictor sampling


class Rope1D(nn.Module):
    """The code predictor's plain 1D rotary behind the slot decoder's 3-row position layout."""

    def __init__(self, rotary: nn.Module) -> None:
        super().__init__()
        self.rotary = rotary

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> Any:
        return self.rotary(x, positions[0])


@dataclass(frozen=True)
class Projected:
    """A text vector already in the talker's space (``tts_eos`` / ``tts_pad``)."""

    value: torch.Tensor


class Qwen3TalkerRunner:
    keeps_kv = True  # conversation KV: ``keep`` and admissions after a kept prefix of the user turns

    def __init__(
        self,
        talker: Any,
        *,
        config: Any,
        text_vectors: dict[int, torch.Tensor],
        slots: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device,
        cuda_graphs: bool,
    ) -> None:
        cfg = talker.config
        text_cfg = cfg.text_config
        self.talker, self.config = talker, config
        self.slots, self.max_len, self.device, self.dtype = slots, max_len, device, dtype
        self.groups = int(cfg.num_code_groups)
        self.vocab = int(text_cfg.vocab_size)
        self.codec_eos = int(cfg.codec_eos_token_id)
        self.codec_eos_ids: tuple[int, ...] = (self.codec_eos,)
        self.speakers = {str(k).lower(): int(v) for k, v in cfg.speaker_id.items()}
        self.turns = TurnTokens(config.im_start_token_id, config.user_token_id, config.assistant_token_id)
        self.tts_pad_id = int(config.tts_pad_token_id)
        thinker_cfg = config.thinker_config
        self.media_id_set = frozenset(
            (thinker_cfg.audio_token_id, thinker_cfg.image_token_id, thinker_cfg.video_token_id)
        )
        self._codec_prefixes: dict[int, torch.Tensor] = {}
        self.suppress = tuple(
            i for i in range(self.vocab - SUPPRESSED_TOP, self.vocab) if i != self.codec_eos
        )
        with torch.inference_mode():  # as generate: the three projected in one call
            ids = (config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id)
            thinker = torch.stack([text_vectors[int(i)] for i in ids]).to(device, dtype)
            self.tts_bos, self.tts_eos, self.tts_pad = talker.text_projection(thinker[None])[0]
        hidden = int(text_cfg.hidden_size)
        self.decoder = SlotDecoder(
            layers=talker.model.layers,
            norm=talker.model.norm,
            rotary=talker.model.rotary_emb,
            embed_fn=lambda ids, extra: extra,  # the step input is built before the step
            head_fn=talker.codec_head,
            slots=slots,
            max_len=max_len,
            kv_heads=text_cfg.num_key_value_heads,
            head_dim=getattr(text_cfg, "head_dim", None) or hidden // text_cfg.num_attention_heads,
            hidden_size=hidden,
            extra_size=hidden,
            vocab_size=self.vocab,
            dtype=dtype,
            device=device,
            cuda_graphs=cuda_graphs,
        )
        self.sampler = BatchSampler(slots=slots, vocab_size=self.vocab, device=device)
        predictor = talker.code_predictor
        self.predictor_sampler = BatchSampler(
            slots=slots, vocab_size=predictor.config.vocab_size, device=device
        )
        pcfg = predictor.config
        phidden = int(pcfg.hidden_size)
        self.predictor = SlotDecoder(  # a frame's positions: talker hidden, first code, 14 more codes
            layers=predictor.model.layers,
            norm=predictor.model.norm,
            rotary=Rope1D(predictor.model.rotary_emb),
            embed_fn=lambda ids, extra: extra,
            head_fn=lambda normed: normed,  # the head differs per codebook: applied outside the graph
            slots=slots,
            max_len=self.groups + 1,
            kv_heads=pcfg.num_key_value_heads,
            head_dim=getattr(pcfg, "head_dim", None) or phidden // pcfg.num_attention_heads,
            hidden_size=phidden,
            extra_size=phidden,
            vocab_size=phidden,
            dtype=dtype,
            device=device,
            cuda_graphs=cuda_graphs,
        )
        self.frame_embed = torch.zeros(slots, hidden, dtype=dtype, device=device)  # next step's codec part
        # The frame graph's fixed buffers: inputs (first code, talker hidden, rows whose draws count)
        # and outputs (the frame's codes, their summed embeddings).
        self.frame_first = torch.zeros(slots, dtype=torch.int64, device=device)
        self.frame_hidden = torch.zeros(slots, phidden, dtype=dtype, device=device)
        self.frame_ready = torch.zeros(slots, dtype=torch.bool, device=device)
        self.frame_codes = torch.zeros(slots, self.groups, dtype=torch.int64, device=device)
        self.frame_summed = torch.zeros(slots, hidden, dtype=dtype, device=device)
        self.frame_graphs = cuda_graphs and device.type == "cuda"
        self._frame_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._frame_pool: Any = None

    def text_vector(self, kind: str) -> Projected:
        return Projected(self.tts_eos if kind == "eos" else self.tts_pad)

    def prompt_length(self, row: TalkerAdmission) -> int:
        return len(talker_prompt_ids(row.input_ids, self.turns, tts_pad=self.tts_pad_id))

    def kept_length(self, row: TalkerAdmission) -> int:
        """The user turns' positions: the assistant part after them is this turn's own."""
        return len(user_positions(row.input_ids, self.turns))

    def shared_length(self, row: TalkerAdmission, thinker_positions: int) -> int:
        """The user positions among the thinker prompt's first ``thinker_positions``: a position's
        turn depends only on the tokens before it, and its vector and rope position only on those
        positions (projections per position; ``get_rope_index`` counts positions and media in
        order), so they are the previous turn's talker positions, bit for bit."""
        return len(user_positions(row.input_ids[:thinker_positions], self.turns))

    @torch.inference_mode()
    def keep(self, *, slot: int, length: int) -> torch.Tensor:
        """The slot's first ``length`` positions (a session's user turns), kept for its next turn."""
        return self.decoder.keep_kv(slot, length)

    # -- admission -----------------------------------------------------------------------------
    @torch.inference_mode()
    def admit(self, rows: list[TalkerAdmission]) -> list[tuple[int, ...]]:
        """Prefill the rows' prompts in one right-padded batch and draw each row's first frame.

        One batch, not one call per row: under load many streams reach the talker together, and
        serial admissions put each one's first audio behind every earlier one's prefill.
        """
        for row in rows:
            if not 0 <= row.slot < self.slots:
                raise ValueError(f"talker slot {row.slot} outside 0..{self.slots - 1}")
        prompts = [self._prompt(row) for row in rows]
        layouts = [self._positions(row) for row in rows]
        lengths = [p.shape[0] for p in prompts]
        slots = [row.slot for row in rows]
        # A session's kept KV of its earlier user turns goes back into the row's slot; the rest
        # (this turn's user positions and the assistant part) prefills after it.
        logits, last = prefill_after_kept(
            self.decoder,
            slots=slots,
            prompts=[(prompt, pos[:, 0]) for prompt, (pos, _) in zip(prompts, layouts, strict=True)],
            kept=[row.prefix for row in rows],
            offsets=[row.prefix_length if row.prefix is not None else 0 for row in rows],
            want_hidden=True,
        )
        assert last is not None
        for row in rows:
            self._set_sampling(row)
        firsts = self.sampler.sample(logits, rows=slots)
        frames, frame_embeds = self._predict(slots, firsts, last)
        for i, row in enumerate(rows):
            self.frame_embed[row.slot] = frame_embeds[i]
            self.decoder.last_ids[row.slot] = firsts[i]
            self.decoder.lengths[row.slot] = lengths[i]
            self.decoder.rope_delta[row.slot] = int(layouts[i][1].reshape(-1)[0])
        return frames

    def _prompt(self, row: TalkerAdmission) -> torch.Tensor:
        talker, ids = self.talker, row.input_ids
        speaker = self.speakers.get(row.voice.lower())
        if speaker is None:
            raise EngineError(
                f"unknown voice {row.voice!r}; available: {', '.join(self.speakers)}", param="audio.voice"
            )
        start = assistant_start(ids, self.turns)
        if start < 0 or len(ids) - start != ASSISTANT_HEADER:
            raise EngineError(
                "the prompt does not end with the assistant header the talker expects", status=500
            )
        vectors = row.prompt_vectors.to(self.device, self.dtype)
        # As generate: every media position through hidden_projection, every text one through
        # text_projection (one call each), then the user positions gathered. The positions are
        # worked out on the host and reach the device in one queued copy: boolean masks on the
        # device would make this thread wait for the GPU a few times per admitted row.
        media_at = [k for k, i in enumerate(ids) if i in self.media_id_set]
        text_at = [k for k, i in enumerate(ids) if i not in self.media_id_set]
        index = to_device(media_at + text_at + user_positions(ids, self.turns), self.device, torch.long)
        media_index, text_index = index[: len(media_at)], index[len(media_at) : len(ids)]
        projected = torch.empty(len(ids), self.tts_pad.shape[-1], dtype=self.dtype, device=self.device)
        if media_at:
            projected[media_index] = talker.hidden_projection(vectors[None, media_index])[0]
        projected[text_index] = talker.text_projection(vectors[None, text_index])[0]
        users = projected[index[len(ids) :]]
        first = row.first_vector.to(self.device, self.dtype)[None]
        assistant = talker.text_projection(torch.cat([vectors[start:], first])[None])[0]
        text = torch.cat([assistant[:3], self.tts_pad.expand(4, -1), self.tts_bos[None], assistant[3:4]])
        return torch.cat([users, text + self._codec_prefix(speaker)])

    def _codec_prefix(self, speaker: int) -> torch.Tensor:
        """The codec half of the assistant prefix for a speaker (3 zero rows, then the embeddings of
        no-think, think-bos, think-eos, the speaker, pad and bos): made once per speaker."""
        prefix = self._codec_prefixes.get(speaker)
        if prefix is None:
            cfg = self.talker.config
            special = [cfg.codec_nothink_id, cfg.codec_think_bos_id, cfg.codec_think_eos_id, speaker]
            special += [cfg.codec_pad_id, cfg.codec_bos_id]
            codec = self.talker.get_input_embeddings()(torch.tensor([special], device=self.device))[0]
            zeros = torch.zeros(3, codec.shape[-1], dtype=codec.dtype, device=self.device)
            prefix = self._codec_prefixes[speaker] = torch.cat([zeros, codec])
        return prefix

    def _positions(self, row: TalkerAdmission) -> tuple[torch.Tensor, torch.Tensor]:
        """The talker prompt's rope positions [3, 1, L] and delta, as get_rope_index gives them."""
        prompt_ids = torch.tensor([talker_prompt_ids(row.input_ids, self.turns, tts_pad=self.tts_pad_id)])
        ctx = row.talker_context
        media = ctx.get("audio_feature_lengths") is not None or any(
            ctx.get(k) is not None and ctx[k].numel() > 0 for k in ("image_grid_thw", "video_grid_thw")
        )
        if not media:
            return torch.arange(prompt_ids.shape[1]).view(1, 1, -1).expand(3, 1, -1), torch.zeros(1)
        positions, delta = self.talker.get_rope_index(
            prompt_ids,
            ctx.get("image_grid_thw"),
            ctx.get("video_grid_thw"),
            torch.ones_like(prompt_ids),
            # Not audio_in_video(ctx): transformers' Qwen3-Omni generate hands the talker the media
            # geometry but not use_audio_in_video, so its talker indexes an interleaved video as if
            # it were not (Qwen2.5's hands it over; its talker runner passes it on).
            False,
            ctx.get("audio_feature_lengths"),
            ctx.get("video_second_per_grid"),
        )
        return positions, delta

    def _set_sampling(self, row: TalkerAdmission) -> None:
        suppress = (*self.suppress, *row.sampling.suppress_tokens)
        self.sampler.set_row(row.slot, replace(row.sampling, suppress_tokens=suppress), history=[])
        greedy = row.sampling.temperature <= 0
        seed = None if row.sampling.seed is None else row.sampling.seed + 1
        self.predictor_sampler.set_row(
            row.slot,
            RowSampling(
                temperature=0.0 if greedy else 1.0, top_k=PREDICTOR_TOP_K, top_p=PREDICTOR_TOP_P, seed=seed
            ),
        )

    # -- decode --------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self, n: int, *, inputs: list[Any], max_length: int) -> list[tuple[int, ...] | None]:
        """Advance rows 0..n-1 by one frame; a row whose input is None is held (no frame)."""
        ready_rows = [i for i, v in enumerate(inputs) if v is not None]
        index = torch.tensor(ready_rows, dtype=torch.int64, device=self.device)
        if ready_rows:
            text = self._project([inputs[i] for i in ready_rows])
            self.decoder.extra[index] = self.frame_embed[index] + text
        out = self.decoder.decode(n, max_length=max_length)
        ready = torch.zeros(n, dtype=torch.bool, device=self.device)
        ready[index] = True
        firsts = self.sampler.sample(out.logits, ready=ready)
        result: list[tuple[int, ...] | None] = [None] * n
        if ready_rows:
            frames, embeds = self._predict(ready_rows, firsts[index], out.hidden[index])
            self.frame_embed[index] = embeds
            for row, frame in zip(ready_rows, frames, strict=True):
                result[row] = frame
        # Held rows keep their state: their write this step is overwritten by their next real one.
        self.decoder.last_ids[:n] = torch.where(ready, firsts, self.decoder.last_ids[:n])
        self.decoder.lengths[:n] += ready.long()
        return result

    def _project(self, vectors: list[Any]) -> torch.Tensor:
        """Talker-space text vectors: thinker reply embeddings through ``text_projection``."""
        out: list[torch.Tensor | None] = [v.value if isinstance(v, Projected) else None for v in vectors]
        raw = [i for i, v in enumerate(out) if v is None]
        if raw:
            stacked = torch.stack([vectors[i].to(self.device, self.dtype) for i in raw])
            for i, value in zip(raw, self.talker.text_projection(stacked[:, None])[:, 0], strict=True):
                out[i] = value
        return torch.stack([v for v in out if v is not None])

    def _predict(
        self, slots: list[int], first: torch.Tensor, past_hidden: torch.Tensor
    ) -> tuple[list[tuple[int, ...]], torch.Tensor]:
        """The code predictor over rows ``slots``: their frames and summed codec embeddings [n, H].

        Rows 0..max(slots) (up to the batch bucket) step together: the predictor keeps nothing
        between frames, so the other rows' work is discarded and their draws do not count.
        """
        index = torch.tensor(slots, dtype=torch.int64, device=self.device)
        n = max(slots) + 1
        batch = next(b for b in self.predictor.batch_buckets if b >= n) if self.frame_graphs else n
        self.frame_ready[:batch] = False
        self.frame_ready[index] = True
        self.frame_first[index] = first
        self.frame_hidden[index] = past_hidden.to(self.dtype)
        graph = self._frame_graph(batch) if self.frame_graphs else None
        if graph is not None:
            graph.replay()
        else:
            self._frame(batch)
        frames = [tuple(int(c) for c in frame) for frame in self.frame_codes[index].tolist()]
        return frames, self.frame_summed[index]

    def _frame(self, batch: int) -> None:
        """One frame for rows ``0..batch-1``, fixed buffers in and out (the frame graph's body).

        Position 0 is the talker's hidden state, position 1 the first code's embedding, position
        k+1 codebook k's embedding, and the hidden state after position k+1 draws codebook k+1
        through ``lm_head[k]``, as transformers' predictor does.
        """
        predictor, decoder = self.talker.code_predictor, self.predictor
        view = decoder.len_buckets[0]  # the predictor's cache is one frame long: one length bucket
        ready = self.frame_ready[:batch]
        first = self.frame_first[:batch]
        first_embed = self.talker.get_input_embeddings()(first)
        embeds, codes = [first_embed], [first]
        for position, value in enumerate((self.frame_hidden[:batch], first_embed)):
            decoder.lengths[:batch] = position
            decoder.extra[:batch] = value
            decoder._step(batch, view)
        for k in range(1, self.groups):
            logits = predictor.lm_head[k - 1](decoder.out_hidden[:batch])
            code = self.predictor_sampler.sample_dense(logits.float(), ready=ready)
            embed = predictor.model.codec_embedding[k - 1](code)
            codes.append(code)
            embeds.append(embed)
            if k < self.groups - 1:
                decoder.lengths[:batch] = k + 1
                decoder.extra[:batch] = embed
                decoder._step(batch, view)
        self.frame_codes[:batch] = torch.stack(codes, dim=1)
        self.frame_summed[:batch] = torch.stack(embeds, dim=1).sum(1)

    def _frame_graph(self, batch: int) -> torch.cuda.CUDAGraph | None:
        graph = self._frame_graphs.get(batch)
        if graph is not None:
            return graph
        try:
            graph = self._capture_frame(batch)
        except RuntimeError as exc:  # a capture problem costs speed, never a request
            log.warning("code predictor frame graph capture failed (%s); running frames eagerly", exc)
            self.frame_graphs = False
            return None
        self._frame_graphs[batch] = graph
        return graph

    def _capture_frame(self, batch: int) -> torch.cuda.CUDAGraph:
        """Capture ``_frame(batch)``; no row's draw counts while warming up and capturing."""
        saved = self.frame_ready.clone()
        self.frame_ready.zero_()
        current = torch.cuda.current_stream(self.device)
        stream = torch.cuda.Stream(device=self.device, priority=current.priority)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            for _ in range(2):  # kernels and workspaces warmed outside the capture
                self._frame(batch)
        current.wait_stream(stream)
        if self._frame_pool is None:
            self._frame_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._frame_pool, stream=stream, capture_error_mode="thread_local"):
            self._frame(batch)
        self.frame_ready.copy_(saved)
        return graph

    @torch.inference_mode()  # the samplers' tables are inference tensors
    def move(self, src: int, dst: int, length: int) -> None:
        self.decoder.move(src, dst, length)
        self.sampler.move(src, dst)
        self.predictor_sampler.move(src, dst)
        self.frame_embed[dst] = self.frame_embed[src]

    def warmup(self) -> None:
        self.decoder.capture_all(max_view=4096)
        with torch.inference_mode():
            for batch in self.predictor.batch_buckets if self.frame_graphs else ():
                if self._frame_graph(batch) is None:
                    break
