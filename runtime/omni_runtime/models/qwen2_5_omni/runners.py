"""Qwen2.5-Omni thinker and talker as continuously batched decoders over a SlotDecoder.

This replicates, per request and incrementally, how ``Qwen2_5OmniForConditionalGeneration.generate``
wires the thinker to the talker:
- the talker's prompt is the thinker prompt's vectors (token embedding, zeroed at media
  placeholders, plus the thinker's last hidden state), then the speaker's text-BOS embedding,
  then the first reply token's vector; codec PAD and BOS embeddings are added to the last two;
- each later talker step feeds ``codec_embedding(previous code) + reply vector``, where reply
  vectors are the thinker's (hidden + embedding) of its 2nd, 3rd, ... reply tokens, then the
  text-EOS embedding once, then the text-PAD embedding for as long as speech continues.
Because the talker step k needs only the thinker's token k, it can run while the thinker is
still generating: that is what makes streaming speech possible.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from omni_runtime.contract.adapter import TalkerAdmission, ThinkerAdmission, ThinkerPrompt, ThinkerStep
from omni_runtime.executor.host_copy import HostLater, to_device
from omni_runtime.executor.kept_kv import KeptKV, media_agreement, suffix_groups
from omni_runtime.executor.sampling import BatchSampler
from omni_runtime.executor.slot_cache import SlotDecoder, prefill_after_kept, right_padded
from omni_runtime.models.common import audio_in_video


def _head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class PendingStep:
    """A queued decode step (``launch``): its talker vectors now, its tokens once copied."""

    def __init__(self, tokens: HostLater, vectors: dict[int, Any]) -> None:
        self.tokens, self.vectors = tokens, vectors

    def get(self) -> ThinkerStep:
        return ThinkerStep(tokens=self.tokens.get(), vectors=self.vectors)


class QwenThinkerRunner:
    """The thinker LM (layers + lm_head) with a per-slot cache and batched sampling."""

    keeps_kv = True  # conversation KV: ``keep`` and admissions after a kept prefix

    def __init__(
        self,
        text_model: Any,
        lm_head: Any,
        config: Any,
        *,
        slots: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device,
        cuda_graphs: bool,
        decodable_vocab: int | None = None,
    ) -> None:
        lm = text_model
        cfg = config.text_config
        self.slots, self.max_len, self.device = slots, max_len, device
        self.embed = lm.embed_tokens
        self.media_ids = torch.tensor(
            [
                config.audio_token_index,
                config.image_token_index,
                config.video_token_index,
            ],
            device=device,
        )
        self.media_id_set = frozenset(int(x) for x in self.media_ids.tolist())  # host-side masks
        self.decoder = SlotDecoder(
            layers=lm.layers,
            norm=lm.norm,
            rotary=lm.rotary_emb,
            embed_fn=lambda ids, extra: self.embed(ids),
            head_fn=lm_head,
            slots=slots,
            max_len=max_len,
            kv_heads=cfg.num_key_value_heads,
            head_dim=_head_dim(cfg),
            hidden_size=cfg.hidden_size,
            extra_size=1,
            vocab_size=cfg.vocab_size,
            dtype=dtype,
            device=device,
            cuda_graphs=cuda_graphs,
        )
        # The LM head is padded past the tokenizer (152064 rows for 151665 tokens in the released
        # 7B): ids the tokenizer cannot decode are never sampled, so every token is text.
        vocab = min(cfg.vocab_size, decodable_vocab or cfg.vocab_size)
        self.sampler = BatchSampler(slots=slots, vocab_size=vocab, device=device)

    @torch.inference_mode()
    def admit(self, rows: list[ThinkerAdmission]) -> list[tuple[int, Any]]:
        if any(not 0 <= r.slot < self.slots for r in rows):
            raise ValueError(f"thinker slots {[r.slot for r in rows]} outside 0..{self.slots - 1}")
        logits: list[Any] = [None] * len(rows)
        vectors: list[Any] = [None] * len(rows)
        # A kept prefix the new prompt agrees with goes back into the row's slot first; a row
        # whose prefix is unusable (0 positions agree) prefills its whole prompt with the others.
        starts = {
            i: self._restore_prefix(r)
            for i, r in enumerate(rows)
            if r.prefix is not None and r.prefix_length > 0
        }
        fresh = [i for i in range(len(rows)) if not starts.get(i)]
        if fresh:
            self._prefill_fresh(rows, fresh, logits, vectors)
        after = [i for i in range(len(rows)) if starts.get(i)]
        for group in suffix_groups(
            [starts[i] for i in after], [len(rows[i].prompt.input_ids) for i in after], self.max_len
        ):
            self._prefill_suffixes(rows, [after[k] for k in group], starts, logits, vectors)
        slots = [r.slot for r in rows]
        for row in rows:
            self.sampler.set_row(row.slot, row.sampling, history=row.prompt.input_ids)
        tokens = self.sampler.sample(torch.cat(logits), rows=slots)
        index = torch.tensor(slots, device=self.device)
        self.decoder.last_ids[index] = tokens
        self.decoder.lengths[index] = torch.tensor(
            [len(r.prompt.input_ids) for r in rows], device=self.device
        )
        self.decoder.rope_delta[index] = torch.tensor([r.prompt.rope_delta for r in rows], device=self.device)
        if self.device.type == "cuda":  # the prompt vectors go to the talker's stream
            torch.cuda.current_stream(self.device).synchronize()
        return [(int(t), v) for t, v in zip(tokens.tolist(), vectors, strict=True)]

    def prompt_vectors(
        self, k: int, ids: list[int], embeds: torch.Tensor, hidden: torch.Tensor
    ) -> torch.Tensor:
        """The talker's prompt vectors of the prefilled positions (ids, their input embeddings and
        final hidden states; ``k`` is the row's index in the prefill batch): Qwen2.5's token
        embedding (zeroed at media placeholders) plus the last hidden state, per position [L, H]."""
        is_media = to_device([i in self.media_id_set for i in ids], self.device, torch.bool)[:, None]
        return embeds.masked_fill(is_media, 0.0) + hidden

    def reply_vectors(self, out: Any, index: Any) -> Any:
        """The talker vectors of a decode step's rows ``index``: Qwen2.5's hidden + input embedding
        (a fresh tensor: survives the next replay)."""
        return out.hidden[index] + out.inputs[index]

    def _prefill_fresh(
        self, rows: list[ThinkerAdmission], which: list[int], logits: list[Any], vectors: list[Any]
    ) -> None:
        """Whole prompts, batched (right-padded)."""
        batch = [rows[i] for i in which]
        lengths = [len(r.prompt.input_ids) for r in batch]
        embeds, positions = right_padded(
            [(r.prompt.embeds, r.prompt.positions) for r in batch],
            dtype=self.decoder.dtype,
            device=self.device,
        )
        hook = self.prefill_hook(batch)
        # Only a family with a hook passes one (the TP leader's decoder takes none).
        extra = {} if hook is None else {"after_layer": hook}
        out, hidden = self.decoder.prefill(
            slots=[r.slot for r in batch],
            embeds=embeds,
            positions=positions,
            lengths=lengths,
            want_hidden=any(r.want_vectors for r in batch),
            **extra,
        )
        for k, (i, row) in enumerate(zip(which, batch, strict=True)):
            logits[i] = out[k : k + 1]
            if row.want_vectors and hidden is not None:
                n = lengths[k]
                vectors[i] = self.prompt_vectors(k, row.prompt.input_ids, embeds[k, :n], hidden[k, :n])

    def _restore_prefix(self, row: ThinkerAdmission) -> int:
        """Copy the part of the session's kept KV this prompt may reuse back into the row's slot
        (exactness: see pipeline/conversation_kv.py); returns its length and sets ``row.reused``."""
        kept: KeptKV = row.prefix
        embeds = row.prompt.embeds.to(self.device, self.decoder.dtype)
        start = media_agreement(kept, embeds, row.prefix_length)
        if row.want_vectors and kept.vectors is None:
            start = 0
        row.reused = start
        if start:
            self.decoder.restore_kv(kept.kv, row.slot, start)
        return start

    def _prefill_suffixes(
        self,
        rows: list[ThinkerAdmission],
        which: list[int],
        starts: dict[int, int],
        logits: list[Any],
        vectors: list[Any],
    ) -> None:
        """Prompts whose first positions are back in their slots (``starts``): the rest of each,
        batched (right-padded), every row attending to its own prefix."""
        batch = [rows[i] for i in which]
        offsets = [starts[i] for i in which]
        lengths = [len(r.prompt.input_ids) - o for r, o in zip(batch, offsets, strict=True)]
        # Only the suffixes reach the device (queued copies): the prefixes' embeddings are in the KV.
        suffixes = [
            to_device(r.prompt.embeds[start:], self.device, self.decoder.dtype)
            for r, start in zip(batch, offsets, strict=True)
        ]
        embeds, positions = right_padded(
            [
                (suffixes[k], r.prompt.positions[:, start:])
                for k, (r, start) in enumerate(zip(batch, offsets, strict=True))
            ],
            dtype=self.decoder.dtype,
            device=self.device,
        )
        hook = self.prefill_hook(batch, offsets=offsets)
        extra = {} if hook is None else {"after_layer": hook}
        out, hidden = self.decoder.prefill(
            slots=[r.slot for r in batch],
            embeds=embeds,
            positions=positions,
            lengths=lengths,
            want_hidden=any(r.want_vectors for r in batch),
            offsets=offsets,
            **extra,
        )
        for k, (i, row) in enumerate(zip(which, batch, strict=True)):
            logits[i] = out[k : k + 1]
            if row.want_vectors and hidden is not None:
                start, n = offsets[k], lengths[k]
                suffix = self.prompt_vectors(k, row.prompt.input_ids[start:], suffixes[k], hidden[k, :n])
                kept: KeptKV = row.prefix
                assert kept.vectors is not None  # a row wanting vectors reuses only a prefix that has them
                vectors[i] = torch.cat([kept.vectors[:start].to(suffix.dtype), suffix])

    @torch.inference_mode()
    def keep(self, *, slot: int, length: int, prompt: ThinkerPrompt, vectors: list[Any] | None) -> KeptKV:
        """The slot's first ``length`` positions, kept for the session's next turn; ``vectors``:
        the prompt's talker vectors [L, H], then one [H] per fed reply token (or None)."""
        joined = None
        if vectors is not None:
            head = vectors[0].to(self.device)
            joined = torch.cat([head, *(v.to(self.device, head.dtype)[None] for v in vectors[1:])])
        ids = torch.tensor(prompt.input_ids[:length], device=self.device)
        media_index = torch.isin(ids, self.media_ids).nonzero()[:, 0]
        embeds = prompt.embeds.to(self.device)
        media_rows = embeds[media_index.to(embeds.device)].to(self.decoder.dtype)
        return KeptKV(
            kv=self.decoder.keep_kv(slot, length),
            media_index=media_index,
            media_rows=media_rows,
            vectors=None if joined is None else joined[:length],
        )

    def prefill_hook(self, rows: list[ThinkerAdmission], offsets: list[int] | None = None) -> Any:
        """What rewrites the prefill's hidden states after each layer (see SlotDecoder.prefill);
        None here, a family's runner may add one. ``offsets``: per row, how many first positions
        are kept KV (the prefill covers the rest only)."""
        return None

    @torch.inference_mode()
    def step(self, n: int, *, vector_slots: list[int], max_length: int) -> ThinkerStep:
        return self.launch(n, vector_slots=vector_slots, max_length=max_length).get()

    @torch.inference_mode()
    def launch(self, n: int, *, vector_slots: list[int], max_length: int) -> PendingStep:
        """Queue one decode step (the graph, sampling, the rows' next input ids and lengths) and
        its tokens' copy to the host; the next step may be queued before this one's tokens are
        read (``PendingStep.get``): everything it reads stays on the device."""
        out = self.decoder.decode(n, max_length=max_length)
        tokens = self.sampler.sample(out.logits)
        vectors: dict[int, Any] = {}
        if vector_slots:
            index = to_device(vector_slots, self.device)
            stacked = self.reply_vectors(out, index)
            vectors = {slot: stacked[i] for i, slot in enumerate(vector_slots)}
        self.decoder.last_ids[:n] = tokens
        self.decoder.lengths[:n] += 1
        return PendingStep(HostLater(tokens), vectors)

    @torch.inference_mode()  # the sampler's tables are inference tensors
    def move(self, src: int, dst: int, length: int) -> None:
        self.decoder.move(src, dst, length)
        self.sampler.move(src, dst)

    def warmup(self) -> None:
        self.decoder.capture_all()


class QwenTalkerRunner:
    """The talker LM (codec embedding + thinker_to_talker_proj + layers + codec_head)."""

    keeps_kv = True  # conversation KV: ``keep`` and admissions after a kept prompt prefix

    def __init__(
        self,
        talker: Any,
        *,
        text_vectors: dict[int, torch.Tensor],
        speakers: dict[str, dict[str, Any]],
        slots: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device,
        cuda_graphs: bool,
    ) -> None:
        cfg = talker.config
        self.talker = talker
        self.slots, self.max_len, self.device, self.dtype = slots, max_len, device, dtype
        self.codec_bos = int(cfg.tts_codec_start_token_id)
        self.codec_pad = int(cfg.tts_codec_pad_token_id)
        self.codec_mask = int(cfg.tts_codec_mask_token_id)
        self.codec_eos_ids: tuple[int, ...] = (self.codec_pad, int(cfg.tts_codec_end_token_id))
        self.text_vectors = {k: v.to(device, dtype) for k, v in text_vectors.items()}
        self.text_eos = int(cfg.tts_text_end_token_id)
        self.text_pad = int(cfg.tts_text_pad_token_id)
        self.speakers = speakers
        codec_embed = talker.model.embed_tokens
        proj = talker.thinker_to_talker_proj
        self.decoder = SlotDecoder(
            layers=talker.model.layers,
            norm=talker.model.norm,
            rotary=talker.model.rotary_emb,
            embed_fn=lambda ids, extra: proj(codec_embed(ids) + extra),
            head_fn=talker.codec_head,
            slots=slots,
            max_len=max_len,
            kv_heads=cfg.num_key_value_heads,
            head_dim=_head_dim(cfg),
            hidden_size=cfg.hidden_size,
            extra_size=cfg.embedding_size,
            vocab_size=cfg.vocab_size,
            dtype=dtype,
            device=device,
            cuda_graphs=cuda_graphs,
        )
        self.sampler = BatchSampler(slots=slots, vocab_size=cfg.vocab_size, device=device)

    def text_vector(self, kind: str) -> torch.Tensor:
        return self.text_vectors[self.text_eos if kind == "eos" else self.text_pad]

    def prompt_length(self, row: TalkerAdmission) -> int:
        return len(row.input_ids) + 2  # the thinker prompt, the speaker's BOS, the first reply token

    def kept_length(self, row: TalkerAdmission) -> int:
        return len(row.input_ids)  # the thinker prompt's positions, one talker position each

    def shared_length(self, row: TalkerAdmission, thinker_positions: int) -> int:
        return min(thinker_positions, len(row.input_ids) - 1)

    @torch.inference_mode()
    def admit(self, rows: list[TalkerAdmission]) -> list[int]:
        """Prefill the rows' prompts in one right-padded batch and draw each row's first code.

        One batch, not one call per row: under load many streams reach the talker together, and
        serial admissions (some 40 ms each for the 7B's talker on an H100) put each one's first
        audio behind every earlier one's prefill. Each row keeps its own rope layout."""
        for row in rows:
            if not 0 <= row.slot < self.slots:
                raise ValueError(f"talker slot {row.slot} outside 0..{self.slots - 1}")
        prompts = [self._prompt(row) for row in rows]
        lengths = [embeds.shape[0] for embeds, _, _ in prompts]
        # A session's kept prompt KV goes back into the row's slot; the rest prefills after it.
        slots = [row.slot for row in rows]
        logits, _ = prefill_after_kept(
            self.decoder,
            slots=slots,
            prompts=[(embeds, positions[:, 0]) for embeds, positions, _ in prompts],
            kept=[row.prefix for row in rows],
            offsets=[row.prefix_length if row.prefix is not None else 0 for row in rows],
            want_hidden=False,
        )
        for row in rows:
            history = [self.codec_mask] * len(row.input_ids) + [self.codec_pad, self.codec_bos]
            # As generate(): the codec BOS is never sampled.
            sampling = replace(row.sampling, suppress_tokens=(*row.sampling.suppress_tokens, self.codec_bos))
            self.sampler.set_row(row.slot, sampling, history=history)
        codes = self.sampler.sample(logits, rows=slots)
        index = torch.tensor(slots, device=self.device)
        self.decoder.last_ids[index] = codes
        self.decoder.lengths[index] = torch.tensor(lengths, device=self.device)
        self.decoder.rope_delta[index] = torch.tensor([delta for _, _, delta in prompts], device=self.device)
        return [int(c) for c in codes.tolist()]

    @torch.inference_mode()
    def keep(self, *, slot: int, length: int) -> torch.Tensor:
        """The slot's first ``length`` positions (a session's prompt), kept for its next turn."""
        return self.decoder.keep_kv(slot, length)

    def _prompt(self, row: TalkerAdmission) -> tuple[torch.Tensor, torch.Tensor, int]:
        """One row's talker prompt: its input vectors [L, H], rope positions [3, 1, L] and delta."""
        talker = self.talker
        bos_token = int(self.speakers[row.voice]["bos_token"])
        codec_embed = talker.model.embed_tokens
        pieces = [
            row.prompt_vectors.to(self.device, self.dtype),
            self.text_vectors[bos_token][None],
            row.first_vector.to(self.device, self.dtype)[None],
        ]
        embeds = torch.cat(pieces, dim=0)
        special = codec_embed(torch.tensor([self.codec_pad, self.codec_bos], device=self.device)).to(
            self.dtype
        )
        embeds[-2:] += special
        lm_input = talker.thinker_to_talker_proj(embeds)
        text_ids = torch.tensor([[*row.input_ids, bos_token, row.first_token]])
        ctx = row.talker_context
        positions, delta = talker.get_rope_index(
            text_ids,
            ctx.get("image_grid_thw"),
            ctx.get("video_grid_thw"),
            torch.ones_like(text_ids),
            audio_in_video(ctx),
            ctx.get("audio_feature_lengths"),
            ctx.get("video_second_per_grid"),
        )
        return lm_input, positions, int(delta.reshape(-1)[0])

    @torch.inference_mode()
    def step(self, n: int, *, inputs: list[Any], max_length: int) -> list[int | None]:
        ready_rows = [i for i, v in enumerate(inputs) if v is not None]
        index = torch.tensor(ready_rows, dtype=torch.int64, device=self.device)
        if ready_rows:
            self.decoder.extra[index] = torch.stack(
                [inputs[i].to(self.device, self.dtype) for i in ready_rows]
            )
        out = self.decoder.decode(n, max_length=max_length)
        ready = torch.zeros(n, dtype=torch.bool, device=self.device)
        ready[index] = True
        codes = self.sampler.sample(out.logits, ready=ready)
        # Held rows keep their last code and length: their write this step is overwritten later.
        self.decoder.last_ids[:n] = torch.where(ready, codes, self.decoder.last_ids[:n])
        self.decoder.lengths[:n] += ready.long()
        values = codes.tolist()
        return [values[i] if inputs[i] is not None else None for i in range(n)]

    @torch.inference_mode()  # the sampler's tables are inference tensors
    def move(self, src: int, dst: int, length: int) -> None:
        self.decoder.move(src, dst, length)
        self.sampler.move(src, dst)

    def warmup(self) -> None:
        self.decoder.capture_all(max_view=4096)
