"""A decoder stack driven with a runtime-managed, per-slot static KV cache (continuous batching).

transformers' own continuous batching works on token-id prompts with 1D positions, and its
StaticCache writes every row at one shared position; the omni thinker needs prompts given as
embeddings (media scattered in), 3D mrope positions, per-row lengths and the hidden states for
the talker. So the runtime owns the cache and drives the model's decoder layers itself:

- one buffer per layer, ``[slots, kv_heads, max_len, head_dim]`` for keys and values; the
  scheduler keeps the running rows dense in slots ``0..n-1``;
- ``SlotKVCache.update`` (the method transformers attention modules call) writes each row at its
  own position and hands back the cache view the step attends to;
- decode steps have static shapes for a (batch bucket, length bucket) pair, so on CUDA each pair
  is captured once as a CUDA graph and replayed; the inputs (last token, row length, rope delta,
  extra embedding) live in fixed device buffers the graph reads, so a step needs no host copies;
- a decode step's attention packs each key/value head's query heads into one call
  (``decode_attention``) instead of copying the cache view per query head;
- on CUDA the decoder layers of the decode step also go through ``torch.compile`` (dynamic
  shapes, compiled once for every layer and bucket): fusing the many small element-wise kernels
  of an eager transformers layer (RMSNorm, rotary, residual adds, SiLU-mul) is what brings a
  batch-1 step near the memory-bandwidth bound. ``OMNI_TORCH_COMPILE=0`` turns it off.
- prefill goes through the same compiled layers (dynamic batch and length): a short prompt's
  prefill is launch-bound like a decode step (an eager Qwen3-Omni thinker prefill of a 30-token
  prompt took 58 ms on an H200, its talker's 61 ms). ``capture_all`` first compiles the prefill
  shapes a request can meet (``SlotDecoder.WARM_PREFILLS``), so no request pays a compile. A
  suffix after a kept conversation prefix runs eagerly. ``OMNI_COMPILE_PREFILL=0`` keeps prefill
  eager.
- even compiled, a short prefill is host-bound: 48 compiled MoE layers took 71 ms of host time
  for 12 ms of kernels (a Qwen3-Omni thinker, one row of 48 tokens, H200; its talker 38 ms for
  3 ms). So on CUDA a fresh prompt's prefill is padded to a (rows, length) bucket and replayed as
  a CUDA graph (``PrefillShapes``): extra rows repeat the last row (same slot, same inputs, so the
  same cache writes), extra positions are right padding as in any batched prefill. Larger
  prefills, suffixes after a kept prefix and prefills with an ``after_layer`` hook run as before.
  After capturing, ``check_prefill_graphs`` compares graph and unpadded prefills of random
  prompts, logs the difference, and turns the graphs off when it is beyond bfloat16 rounding.
  ``OMNI_PREFILL_GRAPHS=0`` turns them off (docs/benchmarks.md: Qwen3 first audio at 32 streams
  0.58 → 0.49 s p95 on an H200). By default (``OMNI_SUFFIX_GRAPHS=0`` turns it off)
  suffixes after a kept prefix do the same in (rows, length, span) buckets captured at start-up
  (``PrefillShapes.suffixes``): the span is the keys their attention reads, the longest prefix
  plus the padded length rounded up to a power of two from 256; a suffix of another bucket runs
  unpadded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from omni_runtime.contract import switches
from omni_runtime.executor import decode_inputs
from omni_runtime.executor.decode_attention import use_packed_decode
from omni_runtime.executor.host_copy import to_device
from omni_runtime.executor.kept_kv import copy_in, copy_out, suffix_groups

log = logging.getLogger(__name__)

EmbedFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (ids [B], extra [B, E]) -> [B, H]
HeadFn = Callable[[torch.Tensor], torch.Tensor]  # normed hidden [B, H] -> logits [B, V]


def _buckets(limit: int, start: int) -> list[int]:
    sizes, size = [], start
    while size < limit:
        sizes.append(size)
        size *= 2
    sizes.append(limit)
    return sizes


# Prefill lengths padded to (tokens): steps of about 1.5x keep the padding waste under half.
PREFILL_LENGTHS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
PREFILL_GRAPH_TOKENS = 4096  # rows x length above which a prefill runs unpadded (compute-bound)
# A suffix after a kept prefix (a conversation's next turn) is padded to one of SUFFIX_LENGTHS and
# reads the keys of its whole span, padded to one of the spans (doubling from 256 up to the
# decoder's max_len): a graph per (rows, length, span) bucket. They are captured at start-up, rows
# up to SUFFIX_GRAPH_ROWS and spans up to SUFFIX_GRAPH_SPAN, never while serving: captured on first
# use, each new bucket cost the request that met it 50-180 ms on an H100, and two captures failed
# under load (docs/benchmarks.md); a suffix of another bucket runs unpadded.
SUFFIX_LENGTHS = (32, 64, 128)
SUFFIX_SPAN_START = 256
SUFFIX_GRAPH_ROWS = 8
SUFFIX_GRAPH_SPAN = 1024


@dataclass(frozen=True)
class PrefillShapes:
    """The (rows, length) buckets a fresh prompt's prefill is padded to, one CUDA graph each."""

    rows: tuple[int, ...]
    lengths: tuple[int, ...]
    max_tokens: int = PREFILL_GRAPH_TOKENS
    spans: tuple[int, ...] = ()  # a suffix bucket's key span; the last is the decoder's max_len
    suffix_lengths: tuple[int, ...] = ()  # a suffix's padded lengths

    @classmethod
    def for_decoder(cls, slots: int, max_len: int) -> PrefillShapes:
        return cls(
            rows=tuple(_buckets(slots, 1)),
            lengths=tuple(n for n in PREFILL_LENGTHS if n <= max_len),
            spans=tuple(_buckets(max_len, min(SUFFIX_SPAN_START, max_len))),
            suffix_lengths=tuple(n for n in SUFFIX_LENGTHS if n < max_len),
        )

    def bucket(self, rows: int, length: int, offsets: list[int] | None = None) -> tuple[int, ...] | None:
        """The smallest bucket holding ``rows`` x ``length``, or None (the prefill runs unpadded).

        With ``offsets`` (suffixes after kept prefixes): (rows, length, span), the span holding
        every row's prefix and the padded suffix, whose padding positions must stay inside the
        slot (the longest prefix plus the padded length at most the last span)."""
        r = next((b for b in self.rows if b >= rows), None)
        lengths = self.lengths if offsets is None else self.suffix_lengths
        n = next((b for b in lengths if b >= length), None)
        if r is None or n is None or r * n > self.max_tokens:
            return None
        if offsets is None:
            return r, n
        span = next((b for b in self.spans if b >= max(offsets) + n), None)
        return None if span is None else (r, n, span)

    def all(self) -> list[tuple[int, int]]:
        return [(r, n) for r in self.rows for n in self.lengths if r * n <= self.max_tokens]

    def suffixes(
        self, *, max_rows: int = SUFFIX_GRAPH_ROWS, max_span: int = SUFFIX_GRAPH_SPAN
    ) -> list[tuple[int, int, int]]:
        """The suffix buckets captured at start-up: rows up to ``max_rows``, spans up to ``max_span``."""
        return [
            (r, n, span)
            for r in self.rows
            if r <= max_rows
            for n in self.suffix_lengths
            if r * n <= self.max_tokens
            for span in self.spans
            if n < span <= max_span
        ]


def add_after_layers(
    index: torch.Tensor, stacked: torch.Tensor
) -> Callable[[int, torch.Tensor], torch.Tensor]:
    """A prefill's ``after_layer`` hook that adds ``stacked[:, i]`` ([n, k, H]: k layers' features)
    at the (batch row, position) pairs ``index`` [2, n] after decoder layer ``i`` < k (Qwen3-Omni's
    DeepStack visual features; under thinker TP every rank adds the same, tp_runner)."""
    where = (index[0], index[1])
    depth = stacked.shape[1]

    def add(layer: int, hidden: torch.Tensor) -> torch.Tensor:
        if layer >= depth:
            return hidden
        return hidden.index_put(where, stacked[:, layer], accumulate=True)

    return add


def right_padded(
    rows: list[tuple[torch.Tensor, torch.Tensor]], *, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A prefill batch from ``(embeds [n, H], positions [3, n])`` per row: ``embeds`` [b, L, H]
    and ``positions`` [3, b, L], each row at the start of its line and zeros after it (L: the
    longest row). Host tensors reach the device in queued copies (``host_copy.to_device``)."""
    width = max(embeds.shape[0] for embeds, _ in rows)
    out = torch.zeros(len(rows), width, rows[0][0].shape[-1], dtype=dtype, device=device)
    positions = torch.zeros(3, len(rows), width, dtype=torch.int64, device=device)
    for k, (embeds, where) in enumerate(rows):
        n = embeds.shape[0]
        out[k, :n] = to_device(embeds, device, dtype)
        positions[:, k, :n] = to_device(where, device)
    return out, positions


def suffix_mask(
    offsets: list[int] | torch.Tensor,
    width: int,
    *,
    span: int | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Attention mask [b, 1, width, span] of suffixes prefilled after kept prefixes: row r's query
    j (its position offsets[r] + j) sees keys 0..offsets[r] + j of its slot. Keys past a row's own
    span are other rows' reach (or stale) and stay hidden. ``span`` defaults to max(offsets) +
    width; ``offsets`` as a device tensor (a padded suffix's graph) needs it given."""
    if isinstance(offsets, torch.Tensor):
        assert span is not None, "a span for offsets on the device"
        starts, device = offsets, offsets.device
    else:
        starts = torch.tensor(offsets, device=device)
        span = max(offsets) + width if span is None else span
    keys = torch.arange(span, device=device)
    queries = torch.arange(width, device=device)[None, :] + starts[:, None]
    return (keys[None, None, :] <= queries[:, :, None])[:, None]


class SlotKVCache:
    """Per-slot static KV buffers; duck-types ``transformers.Cache.update`` for the attention modules."""

    def __init__(
        self, *, layers: int, slots: int, kv_heads: int, max_len: int, head_dim: int, dtype, device
    ) -> None:
        shape = (slots, kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.max_len = max_len
        # Set by the decoder before each forward.
        self.prefill_slots: torch.Tensor | None = None
        # Rows whose prompts continue prefixes already in their slots: each row's kept length [b]
        # (None: fresh prompts), and how many key positions their attention reads (the longest
        # prefix plus the prefill's width).
        self.prefill_offsets: torch.Tensor | None = None
        self.prefill_span = 0
        self.write_pos: torch.Tensor | None = None  # [B] decode write positions
        self.view_len = 0
        # Decode steps name the layer's buffers here instead of by ``layer_idx``: a compiled
        # layer would otherwise specialise on the index and compile once per layer.
        self.layer_keys: torch.Tensor | None = None
        self.layer_values: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        if self.layer_keys is not None and self.layer_values is not None:
            keys, values = self.layer_keys, self.layer_values
        else:
            keys, values = self.keys[layer_idx], self.values[layer_idx]
        if self.prefill_slots is not None:
            length = key_states.shape[2]
            if self.prefill_offsets is not None:  # suffixes: each after its row's kept prefix
                at = self.prefill_offsets[:, None] + torch.arange(length, device=key_states.device)
                slots = self.prefill_slots[:, None]
                # [rows, length] positions: the indexed view is [b, length, heads, dim]
                keys[slots, :, at] = key_states.transpose(1, 2)
                values[slots, :, at] = value_states.transpose(1, 2)
                span = self.prefill_span
                return keys[self.prefill_slots, :, :span], values[self.prefill_slots, :, :span]
            keys[self.prefill_slots, :, :length] = key_states
            values[self.prefill_slots, :, :length] = value_states
            return key_states, value_states  # a fresh prompt attends only to itself
        rows = key_states.shape[0]
        index = torch.arange(rows, device=key_states.device)
        keys[index, :, self.write_pos] = key_states[:, :, 0]
        values[index, :, self.write_pos] = value_states[:, :, 0]
        return keys[:rows, :, : self.view_len], values[:rows, :, : self.view_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:  # asked by some generic code paths
        return self.view_len

    def move(self, src: int, dst: int, length: int) -> None:
        for keys, values in zip(self.keys, self.values, strict=True):
            keys[dst, :, :length] = keys[src, :, :length]
            values[dst, :, :length] = values[src, :, :length]


def _compiled(layers: nn.ModuleList) -> list[Callable[..., Any]]:
    """The layers behind ``torch.compile`` for decode steps (prefill stays eager: its shapes vary
    with every prompt and it runs once per request).

    ``dynamic=True`` keeps one compiled graph for every (batch, length) bucket. Decoder layers
    share one code object (transformers' ``GradientCheckpointingLayer.__call__``), and so do the
    layers of every stack a process compiles (a thinker, a talker, a code predictor), so dynamo's
    guard cache for that code must hold ``GUARD_ENTRIES_PER_LAYER`` entries for every layer of
    every stack. Past its limit dynamo runs the layer eagerly, without a word beyond one warning.
    """
    import torch._dynamo

    global _COMPILED_LAYERS
    _COMPILED_LAYERS += len(layers)
    limit = GUARD_ENTRIES_PER_LAYER * _COMPILED_LAYERS
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, limit)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, limit * 2)
    return [torch.compile(layer, dynamic=True) for layer in layers]


# Guard entries one compiled layer may need: a row count of 1 is specialised apart from the
# dynamic one, a branch on the row count (an MoE block's fused decode path up to
# moe_decode.MAX_FUSED_ROWS rows, grouped GEMMs above) splits the dynamic range again, and prefill
# adds its own regions (``SlotDecoder.WARM_PREFILLS``).
GUARD_ENTRIES_PER_LAYER = 24
_COMPILED_LAYERS = 0  # layers this process has compiled, over every stack


@dataclass
class DecodeOutputs:
    logits: torch.Tensor  # [n, V] float32 (view of a static buffer: consume before the next step)
    hidden: torch.Tensor  # [n, H] final-norm hidden state of each row's input token
    inputs: torch.Tensor  # [n, H] the embedding each row was fed (thinker: token embedding)


class SlotDecoder:
    """Prefill and batched decode over a stack of transformers decoder layers and a SlotKVCache.

    ``embed_fn(ids, extra)`` turns each row's step input into an embedding (the thinker looks up
    its token; the talker adds the thinker's reply vector to its codec embedding and projects);
    ``head_fn`` maps the final-norm hidden state to logits. Row state lives in device buffers:
    ``last_ids`` (the token fed next), ``lengths`` (tokens in the cache) and ``rope_delta``
    (mrope position minus cache position); ``extra`` carries a per-row vector for ``embed_fn``.
    """

    def __init__(
        self,
        *,
        layers: nn.ModuleList,
        norm: nn.Module,
        rotary: nn.Module,
        embed_fn: EmbedFn,
        head_fn: HeadFn,
        slots: int,
        max_len: int,
        kv_heads: int,
        head_dim: int,
        hidden_size: int,
        extra_size: int,
        vocab_size: int,
        dtype: torch.dtype,
        device: torch.device,
        cuda_graphs: bool,
        compile_layers: bool | None = None,
    ) -> None:
        self.layers, self.norm, self.rotary = layers, norm, rotary
        if switches.flag("OMNI_PACKED_DECODE"):  # 0: transformers' repeat_kv, to measure
            use_packed_decode(layers)
        if compile_layers is None:
            compile_layers = device.type == "cuda" and switches.flag("OMNI_TORCH_COMPILE")
        self.step_layers: list[Callable[..., Any]] = list(layers)
        if compile_layers:
            self.step_layers = _compiled(layers)
        self.compile_prefill = compile_layers and switches.flag("OMNI_COMPILE_PREFILL")
        self.prefill_layers: list[Callable[..., Any]] = (
            self.step_layers if self.compile_prefill else list(layers)
        )
        # A suffix after a kept prefix runs eagerly: the cache reads its offset as a plain int,
        # which a compiled layer specialises on, so every new offset recompiled every layer.
        self.suffix_layers: list[Callable[..., Any]] = list(layers)
        # What a decode step calls per layer: the step layers, or a family's fused decode layers
        # that fall back to them (executor.moe_layer).
        self.decode_layers: list[Callable[..., Any]] | None = None  # None: the step layers
        # Or a family's whole stack in one call where it takes the step: ``(hidden, position
        # embeddings, cache)`` gives the last layer's output, or None (the layers run one by one).
        self.decode_stack: Callable[..., torch.Tensor | None] | None = None
        self.embed_fn, self.head_fn = embed_fn, head_fn
        self.slots, self.max_len, self.device, self.dtype = slots, max_len, device, dtype
        # A decode step's positions, rotary cos/sin and mask, and its final norm, one kernel each
        # where they reproduce the modules (executor.decode_inputs); None: the modules.
        self.step_inputs: decode_inputs.StepInputs | None = None
        self.final_norm: decode_inputs.FinalNorm | None = None
        if switches.flag("OMNI_STEP_INPUTS_KERNEL"):
            self.step_inputs = decode_inputs.step_inputs(rotary, dtype=dtype, device=device, max_len=max_len)
            self.final_norm = decode_inputs.final_norm(norm, dtype=dtype, device=device)
        self.cache = SlotKVCache(
            layers=len(layers),
            slots=slots,
            kv_heads=kv_heads,
            max_len=max_len,
            head_dim=head_dim,
            dtype=dtype,
            device=device,
        )
        self.last_ids = torch.zeros(slots, dtype=torch.int64, device=device)
        self.lengths = torch.zeros(slots, dtype=torch.int64, device=device)
        self.rope_delta = torch.zeros(slots, dtype=torch.int64, device=device)
        self.extra = torch.zeros(slots, extra_size, dtype=dtype, device=device)
        self.out_logits = torch.zeros(slots, vocab_size, dtype=torch.float32, device=device)
        self.out_hidden = torch.zeros(slots, hidden_size, dtype=dtype, device=device)
        self.out_inputs = torch.zeros(slots, hidden_size, dtype=dtype, device=device)
        self.batch_buckets = _buckets(slots, 1)
        self.len_buckets = _buckets(max_len, min(256, max_len))
        self.cuda_graphs = cuda_graphs and device.type == "cuda"
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._pool: Any = None
        self._stream: torch.cuda.Stream | None = None
        # Fresh prompts' prefills padded to buckets (``PrefillShapes``), replayed as CUDA graphs on
        # CUDA; ``prefill_padded`` alone (tests, on CPU) runs the same padded body eagerly.
        self.prefill_shapes = PrefillShapes.for_decoder(slots, max_len)
        # On unless ``OMNI_PREFILL_GRAPHS=0``; the start-up check (``check_prefill_graphs``) turns
        # them off when a graph's prefill differs from the unpadded one.
        self.prefill_graphs = self.cuda_graphs and switches.flag("OMNI_PREFILL_GRAPHS")
        self.prefill_padded = self.prefill_graphs
        # Suffixes after a kept prefix the same way, in (rows, length, span) buckets captured at
        # start-up (``PrefillShapes.suffixes``); ``OMNI_SUFFIX_GRAPHS=0`` turns them off.
        self.suffix_graphs = self.prefill_graphs and switches.flag("OMNI_SUFFIX_GRAPHS")
        self.suffix_padded = self.suffix_graphs
        self._prefill_graphs: dict[tuple[int, ...], torch.cuda.CUDAGraph] = {}
        self._capturing = False  # capture_prefills under way: suffix buckets may be captured
        self._pf: dict[str, torch.Tensor] = {}  # the padded prefill's buffers, made on first use
        # A layer whose output every prefill keeps (before any ``after_layer`` change), as
        # ``kept_hidden`` [rows, width, H] until the next prefill: Qwen3-Omni's talker reads the
        # thinker's hidden states at its accept layer.
        self.keep_layer: int | None = None
        self.kept_hidden: torch.Tensor | None = None

    # -- prefill -----------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(
        self,
        *,
        slots: list[int],
        embeds: torch.Tensor,
        positions: torch.Tensor,
        lengths: list[int],
        want_hidden: bool,
        after_layer: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
        offsets: list[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run prompts (right-padded ``embeds`` [b, L, H], ``positions`` [3, b, L]) into ``slots``.

        ``after_layer(i, hidden)``, when given, rewrites the hidden states after decoder layer ``i``
        (Qwen3-Omni adds its vision tower's DeepStack features to the first layers' outputs).
        ``offsets`` (one per row, any > 0): each slot already holds that many positions of its
        prompt (a kept conversation prefix); ``embeds`` are the rest, written after them and
        attending to them (``lengths`` count the rest only). Rows of different prefixes run as one
        batch: row r's query j sees its keys 0..offsets[r] + j, read from its slot.

        Returns the last real position's logits [b, V] (float32) and, when asked, the final-norm
        hidden states of every position [b, L, H]. Causal attention keeps real tokens from seeing
        the right padding; padded positions write cache entries past each row's length, which the
        row's mask never reads and its next tokens overwrite.
        """
        suffix = offsets is not None and any(offsets)
        if offsets is not None and len(offsets) != len(slots):
            raise ValueError(f"{len(offsets)} prefix offsets for {len(slots)} rows")
        if (self.suffix_padded if suffix else self.prefill_padded) and after_layer is None:
            kept = offsets if suffix else None
            shape = self._padded_shape(len(slots), embeds.shape[1], kept)
            if shape is not None and self._fill_prefill(shape, slots, embeds, positions, lengths, kept):
                return self._prefill_bucket(shape, len(slots), embeds.shape[1], want_hidden)
        self.cache.prefill_slots = to_device(slots, self.device, torch.int64)
        mask = None
        if suffix:
            assert offsets is not None
            width = embeds.shape[1]
            span = max(offsets) + width
            if span > self.max_len:
                raise ValueError(
                    f"suffixes of {width} after a prefix of {max(offsets)} exceed {self.max_len}"
                )
            self.cache.prefill_offsets = to_device(offsets, self.device, torch.int64)
            self.cache.prefill_span = span
            mask = suffix_mask(offsets, width, device=self.device)
        # An inference tensor always: the compiled layers guard on it, and a plain one (made
        # outside inference mode) would compile every layer a second time, mid-request.
        hidden = embeds.to(self.dtype, copy=not embeds.is_inference())
        layers = self.suffix_layers if suffix else self.prefill_layers
        hidden = self._prefill_layers(layers, hidden, positions, mask, after_layer)
        last = to_device([n - 1 for n in lengths], self.device, torch.int64)
        last_hidden = hidden[torch.arange(len(slots), device=self.device), last]
        logits = self.head_fn(last_hidden).float()
        return logits, (hidden if want_hidden else None)

    def _prefill_layers(
        self,
        layers: list[Callable[..., Any]],
        hidden: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        after_layer: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The stack over a prefill's embeddings (``cache.prefill_*`` set by the caller), then the
        final norm; clears the cache's prefill state."""
        cache = self.cache
        self.kept_hidden = None
        try:
            cos_sin = self.rotary(hidden, positions)
            for index, layer in enumerate(layers):
                # By buffer, not layer index, as in decode: a compiled layer stays one graph.
                cache.layer_keys, cache.layer_values = cache.keys[index], cache.values[index]
                hidden = layer(
                    hidden, attention_mask=mask, position_embeddings=cos_sin, past_key_values=cache
                )
                if isinstance(hidden, tuple):
                    hidden = hidden[0]
                if index == self.keep_layer:
                    self.kept_hidden = hidden
                if after_layer is not None:
                    hidden = after_layer(index, hidden)
        finally:
            cache.prefill_slots = None
            cache.prefill_offsets = None
            cache.prefill_span = 0
            cache.layer_keys = cache.layer_values = None
        return self.norm(hidden)  # type: ignore[no-any-return]

    # -- prefill padded to a bucket, as a CUDA graph -------------------------------------------
    def _fill_prefill(
        self,
        shape: tuple[int, ...],
        slots: list[int],
        embeds: torch.Tensor,
        positions: torch.Tensor,
        lengths: list[int],
        offsets: list[int] | None = None,
    ) -> bool:
        """Copy a prefill (suffixes after ``offsets`` kept positions, if given) into the padded
        buffers of ``shape``; False if its layout does not fit them (the prefill then runs
        unpadded)."""
        rows, width = len(slots), embeds.shape[1]
        if positions.dim() != 3 or positions.shape[1:] != (rows, width) or embeds.shape[0] != rows:
            return False
        pf = self._pf
        if not pf:
            tokens = self.prefill_shapes.max_tokens
            most = max(self.prefill_shapes.rows)
            hidden = self.out_hidden.shape[-1]
            pf["embeds"] = torch.zeros(tokens, hidden, dtype=self.dtype, device=self.device)
            pf["positions"] = torch.zeros(positions.shape[0], tokens, dtype=torch.int64, device=self.device)
            pf["slots"] = torch.zeros(most, dtype=torch.int64, device=self.device)
            pf["last"] = torch.zeros(most, dtype=torch.int64, device=self.device)
            pf["offsets"] = torch.zeros(most, dtype=torch.int64, device=self.device)
            pf["rows"] = torch.arange(most, device=self.device)
            pf["hidden"] = torch.zeros(tokens, hidden, dtype=self.dtype, device=self.device)
            pf["kept"] = torch.zeros(tokens, hidden, dtype=self.dtype, device=self.device)
            pf["logits"] = torch.zeros(
                most, self.out_logits.shape[-1], dtype=torch.float32, device=self.device
            )
        if pf["positions"].shape[0] != positions.shape[0]:
            return False
        r, n = shape[:2]
        emb = pf["embeds"][: r * n].view(r, n, -1)
        pos = pf["positions"][:, : r * n].view(-1, r, n)
        emb[:rows, :width].copy_(embeds)
        pos[:, :rows, :width].copy_(positions)
        if width < n:  # right padding: past every row's length, never attended to by a real token
            emb[:rows, width:].zero_()
            pos[:, :rows, width:].zero_()
        if rows < r:  # extra rows repeat the last one: the same slot gets the same writes
            emb[rows:].copy_(emb[rows - 1 : rows].expand(r - rows, -1, -1))
            pos[:, rows:].copy_(pos[:, rows - 1 : rows].expand(-1, r - rows, -1))
        pad = r - rows
        pf["slots"][:r].copy_(to_device(list(slots) + [slots[-1]] * pad, self.device, torch.int64))
        pf["last"][:r].copy_(
            to_device([k - 1 for k in lengths] + [lengths[-1] - 1] * pad, self.device, torch.int64)
        )
        if offsets is not None:
            pf["offsets"][:r].copy_(to_device(list(offsets) + [offsets[-1]] * pad, self.device, torch.int64))
        return True

    def _prefill_body(self, shape: tuple[int, ...]) -> None:
        """The padded prefill of ``shape`` over the buffers ``_fill_prefill`` wrote (a graph body):
        (rows, length) fresh prompts, (rows, length, span) suffixes after kept prefixes."""
        r, n = shape[:2]
        pf = self._pf
        self.cache.prefill_slots = pf["slots"][:r]
        embeds = pf["embeds"][: r * n].view(r, n, -1)
        positions = pf["positions"][:, : r * n].view(-1, r, n)
        layers, mask = self.prefill_layers, None
        if len(shape) > 2:  # suffixes: each row writes after, and attends to, its kept prefix
            offsets = pf["offsets"][:r]
            self.cache.prefill_offsets, self.cache.prefill_span = offsets, shape[2]
            mask = suffix_mask(offsets, n, span=shape[2])
            layers = self.suffix_layers
        hidden = self._prefill_layers(layers, embeds, positions, mask)
        pf["hidden"][: r * n].view(r, n, -1).copy_(hidden)
        if self.kept_hidden is not None:
            pf["kept"][: r * n].view(r, n, -1).copy_(self.kept_hidden)
        last_hidden = hidden[pf["rows"][:r], pf["last"][:r]]
        pf["logits"][:r].copy_(self.head_fn(last_hidden).float())

    def _prefill_bucket(
        self, shape: tuple[int, ...], rows: int, width: int, want_hidden: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        suffix = len(shape) > 2
        graphs = self.suffix_graphs if suffix else self.prefill_graphs
        graph = self._prefill_graphs.get(shape) if graphs else None
        if graphs and graph is None:
            try:
                graph = self._capture_prefill(shape)
            except RuntimeError as exc:  # a capture problem costs speed, never a request
                log.warning("prefill CUDA graph capture failed (%s); prefilling unpadded from now on", exc)
                self.unpadded_prefills()
                self.cache.prefill_slots = self.cache.prefill_offsets = None
                self.cache.prefill_span = 0
        if graph is not None:
            graph.replay()
        else:
            self._prefill_body(shape)
        r, n = shape[:2]

        def out(name: str) -> torch.Tensor:
            return self._pf[name][: r * n].view(r, n, -1)[:rows, :width].clone()

        self.kept_hidden = out("kept") if self.keep_layer is not None else None
        return self._pf["logits"][:rows].clone(), (out("hidden") if want_hidden else None)

    def unpadded_prefills(self) -> None:
        """Every prefill from now on runs unpadded, without graphs (fresh prompts and suffixes)."""
        self.prefill_graphs = self.prefill_padded = False
        self.suffix_graphs = self.suffix_padded = False

    def _padded_shape(self, rows: int, width: int, offsets: list[int] | None) -> tuple[int, ...] | None:
        """The bucket a prefill is padded to, or None (it runs unpadded): with suffix graphs on,
        a suffix whose bucket was not captured at start-up runs unpadded (no capture while serving)."""
        shape = self.prefill_shapes.bucket(rows, width, offsets)
        if (
            shape is not None
            and offsets is not None
            and self.suffix_graphs
            and not self._capturing
            and shape not in self._prefill_graphs
        ):
            return None
        return shape

    def _capture_prefill(self, shape: tuple[int, ...]) -> torch.cuda.CUDAGraph:
        """Capture the padded prefill of ``shape``. Its warm-up run prefills the buffers' rows for
        real (the request being admitted, or scratch slots at start-up)."""
        stream = self._side_stream()
        with torch.cuda.stream(stream):
            self._prefill_body(shape)  # compiles a new guard region outside the capture
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"):
            self._prefill_body(shape)
        self._prefill_graphs[shape] = graph
        return graph

    @torch.inference_mode()
    def capture_prefills(self) -> int:
        """Capture every prefill bucket now (scratch slots, before any request), so no request
        pays a capture; the number captured."""
        if not self.prefill_graphs:
            return 0
        for rows, length in self.prefill_shapes.all():
            if (rows, length) in self._prefill_graphs or rows > self.slots:
                continue
            self._scratch_prefill(rows, length)
            if not self.prefill_graphs:
                break
        if self.suffix_graphs:  # each after a scratch prefix that fills its span
            began, before = time.perf_counter(), len(self._prefill_graphs)
            self._capturing = True
            try:
                for rows, length, span in self.prefill_shapes.suffixes():  # rows <= slots, span <= max_len
                    if (rows, length, span) in self._prefill_graphs:
                        continue
                    self._scratch_prefill(rows, length, offset=span - length)
                    if not self.suffix_graphs:
                        break
            finally:
                self._capturing = False
            log.info(
                "captured %d suffix prefill graphs (rows, length, span) in %.1f s",
                len(self._prefill_graphs) - before,
                time.perf_counter() - began,
            )
        if self.prefill_graphs and not self.check_prefill_graphs():
            self.unpadded_prefills()
            self._prefill_graphs.clear()
        return len(self._prefill_graphs)

    # Largest |graph - unpadded| a checked prefill may show, relative to the largest unpadded
    # value: bfloat16 rounding of differently shaped GEMMs stays far below it, a wrong graph not.
    PREFILL_CHECK_TOLERANCE = 0.05

    @torch.inference_mode()
    def check_prefill_graphs(
        self, shapes: tuple[tuple[int, int, int], ...] = ((1, 37, 0), (3, 21, 0), (2, 21, 40))
    ) -> bool:
        """Prefill random prompts (scratch slots, start-up only) through the graphs and unpadded,
        log the largest difference; False (the graphs are not to be used) when it is beyond
        ``PREFILL_CHECK_TOLERANCE``. Shapes are (rows, length, kept prefix); a suffix shape is
        checked where suffixes are padded."""
        generator = torch.Generator(device=self.device).manual_seed(0)
        worst = 0.0
        for rows, length, offset in shapes:
            kept = [offset] * rows if offset else None
            if (
                (self.suffix_padded if offset else self.prefill_padded)
                and rows <= self.slots
                and offset + length + 2 <= self.max_len
                and self.prefill_shapes.bucket(rows, length, kept)
            ):
                differences = self.prefill_differences(rows, length, generator, offset=offset)
                worst = max([worst, *(v for k, v in differences.items() if k != "argmax equal")])
        ok = worst <= self.PREFILL_CHECK_TOLERANCE
        (log.info if ok else log.warning)(
            "prefill graphs %s: largest difference from the unpadded prefill %.2g of the largest value%s",
            "checked" if ok else "DIFFER",
            worst,
            "" if ok else f" (over {self.PREFILL_CHECK_TOLERANCE}); prefilling unpadded",
        )
        return ok

    @torch.inference_mode()
    def prefill_differences(
        self, rows: int, length: int, generator: torch.Generator, *, offset: int = 0
    ) -> dict[str, float]:
        """One prefill of random embeddings (ragged lengths, scratch slots ``0..rows-1``; after a
        random kept prefix of ``offset`` positions, if given) padded and unpadded: the largest
        difference of the logits, the hidden states, the kept layer's states and the last layer's
        keys at real positions, each relative to its largest unpadded value, and whether every
        row's argmax agrees (1.0) or not (0.0)."""
        lengths = [max(1, length - 5 * k) for k in range(rows)]
        hidden_size = self.out_hidden.shape[-1]

        def randn(width: int) -> torch.Tensor:
            shape = (rows, width, hidden_size)
            return torch.randn(shape, device=self.device, dtype=self.dtype, generator=generator)

        def arange(start: int, width: int) -> torch.Tensor:
            return torch.arange(start, start + width, device=self.device).view(1, 1, -1).expand(3, rows, -1)

        embeds, positions = randn(length), arange(offset, length)
        padded_before = self.prefill_padded, self.suffix_padded
        outs: list[dict[str, list[torch.Tensor]]] = []
        try:
            if offset:  # the kept prefix, once, unpadded: both suffixes attend to the same one
                self.prefill_padded = False
                self.prefill(
                    slots=list(range(rows)),
                    embeds=randn(offset),
                    positions=arange(0, offset),
                    lengths=[offset] * rows,
                    want_hidden=False,
                )
            for padded in (False, True):
                self.prefill_padded = self.suffix_padded = padded
                logits, hidden = self.prefill(
                    slots=list(range(rows)),
                    embeds=embeds,
                    positions=positions,
                    lengths=lengths,
                    want_hidden=True,
                    offsets=[offset] * rows if offset else None,
                )
                assert hidden is not None
                kept = self.kept_hidden
                outs.append(
                    {
                        "logits": [logits.float()],
                        "hidden": [hidden[r, :n].float() for r, n in enumerate(lengths)],
                        "kept layer": []
                        if kept is None
                        else [kept[r, :n].float() for r, n in enumerate(lengths)],
                        "keys": [
                            self.cache.keys[-1][r, :, : offset + n].float().clone()
                            for r, n in enumerate(lengths)
                        ],
                    }
                )
        finally:
            self.prefill_padded, self.suffix_padded = padded_before
        want, got = outs
        out: dict[str, float] = {}
        for name, tensors in want.items():
            if tensors:
                out[name] = max(
                    float((b - a).abs().max()) / (float(a.abs().max()) or 1.0)
                    for a, b in zip(tensors, got[name], strict=True)
                )
        out["argmax equal"] = float(torch.equal(want["logits"][0].argmax(-1), got["logits"][0].argmax(-1)))
        return out

    def _scratch_prefill(self, rows: int, length: int, *, offset: int = 0) -> None:
        """A prefill of zeros into slots ``0..rows-1`` (start-up only: no request holds them);
        with ``offset``, a suffix after that many positions the slots are taken to hold."""
        hidden = self.out_hidden.shape[-1]
        embeds = torch.zeros(rows, length, hidden, dtype=self.dtype, device=self.device)
        positions = (
            torch.arange(offset, offset + length, device=self.device).view(1, 1, -1).expand(3, rows, -1)
        )
        self.prefill(
            slots=list(range(rows)),
            embeds=embeds,
            positions=positions,
            lengths=[length] * rows,
            want_hidden=False,
            offsets=[offset] * rows if offset else None,
        )

    # -- decode ------------------------------------------------------------------------------
    @torch.inference_mode()
    def decode(self, n: int, *, max_length: int) -> DecodeOutputs:
        """One step for rows ``0..n-1``: feed ``last_ids``/``extra``, write at ``lengths``.

        ``max_length`` is the largest row length after this step (host-side bookkeeping picks
        the attention length bucket from it). Lengths are not advanced here: the caller does,
        only for rows whose step counted.
        """
        batch = next(b for b in self.batch_buckets if b >= n)
        view = next(t for t in self.len_buckets if t >= max_length)
        graph = self._graphs.get((batch, view)) if self.cuda_graphs else None
        if self.cuda_graphs and graph is None:
            try:
                graph = self._capture(batch, view)
            except RuntimeError as exc:  # a capture problem costs speed, never a request
                log.warning("decode CUDA graph capture failed (%s); decoding eagerly from now on", exc)
                self.cuda_graphs = False
        if graph is not None:
            graph.replay()
        else:
            self._step(batch, view)  # the same padded shapes as the graphs, run eagerly
        return DecodeOutputs(self.out_logits[:n], self.out_hidden[:n], self.out_inputs[:n])

    def _step(self, batch: int, view: int) -> None:
        """The graph body: everything reads and writes fixed buffers."""
        ids = self.last_ids[:batch]
        inputs = self.embed_fn(ids, self.extra[:batch]).to(self.dtype)
        hidden = inputs[:, None, :]
        # Padding rows are free slots with stale lengths (up to max_len): clamp so they write in bounds.
        if self.step_inputs is not None:
            write, cos_sin, mask = self.step_inputs(self.lengths[:batch], self.rope_delta[:batch], view)
        else:
            write = self.lengths[:batch].clamp(max=self.max_len - 1)
            pos = (write + self.rope_delta[:batch]).view(1, batch, 1).expand(3, batch, 1)
            cos_sin = self.rotary(hidden, pos)
            mask = torch.arange(view, device=self.device)[None, :] <= write[:, None]
            mask = mask[:, None, None, :]
        cache = self.cache
        cache.write_pos = write
        cache.view_len = view
        stacked = None if self.decode_stack is None else self.decode_stack(hidden, cos_sin, cache)
        if stacked is not None:
            hidden = stacked
        else:
            try:
                for i, layer in enumerate(self.decode_layers or self.step_layers):
                    cache.layer_keys, cache.layer_values = cache.keys[i], cache.values[i]
                    hidden = layer(
                        hidden, attention_mask=mask, position_embeddings=cos_sin, past_key_values=cache
                    )
                    if isinstance(hidden, tuple):
                        hidden = hidden[0]
            finally:
                cache.layer_keys = cache.layer_values = None
        normed = self.norm(hidden[:, 0]) if self.final_norm is None else self.final_norm(hidden[:, 0])
        self.out_logits[:batch].copy_(self.head_fn(normed))
        self.out_hidden[:batch].copy_(normed)
        self.out_inputs[:batch].copy_(inputs)

    def _side_stream(self) -> torch.cuda.Stream:
        """The capture stream, after everything queued on the current one."""
        if self._stream is None:
            # Same priority as the replaying stream: a graph's kernels keep their capture stream's.
            priority = torch.cuda.current_stream(self.device).priority
            self._stream = torch.cuda.Stream(device=self.device, priority=priority)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        return self._stream

    def _capture(self, batch: int, view: int) -> torch.cuda.CUDAGraph:
        stream = self._side_stream()
        with torch.cuda.stream(stream):
            # Rows past the running batch are free slots: their writes land in unused cache rows.
            for _ in range(2):  # warm up kernels and workspaces outside the capture
                self._step(batch, view)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        # thread_local: other stage threads keep using CUDA (syncs included) while this one captures.
        with torch.cuda.graph(graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"):
            self._step(batch, view)
        self._graphs[(batch, view)] = graph
        return graph

    @torch.inference_mode()
    def capture_all(
        self, *, max_view: int | None = None, progress: Callable[[str], None] | None = None
    ) -> int:
        """Capture every (batch, length) bucket up front so no request pays a capture (and compile
        the prefill shapes first, ``warm_prefill``)."""
        self.warm_prefill()
        prefills = self.capture_prefills()
        if progress and prefills:
            progress(f"captured {prefills} prefill graphs")
        if not self.cuda_graphs:
            return 0
        views = [t for t in self.len_buckets if max_view is None or t <= max_view]
        for view in views:
            for batch in self.batch_buckets:
                if (batch, view) in self._graphs:
                    continue
                try:
                    self._capture(batch, view)
                except RuntimeError as exc:
                    log.warning("decode CUDA graph capture failed (%s); decoding eagerly", exc)
                    self.cuda_graphs = False
                    return len(self._graphs)
            if progress:
                progress(f"captured decode graphs up to length {view}")
        return len(self._graphs)

    # (rows, length) of the warm-up prefills. The compiled layers guard on the row count and the
    # length (1 is compiled apart from the dynamic range) and on the tokens in the call (rows x
    # length): up to moe_decode.MAX_FUSED_ROWS (an MoE block's fused path), below 64 and from 64
    # on (inductor's matmul padding pass), so each region is met once for one row and for
    # several. A region missed here is compiled by the first request that meets it: every layer,
    # seconds of a stalled batch (tests/gpu/test_qwen3_talker_cuda.py checks a table of shapes).
    WARM_PREFILLS = ((1, 1), (2, 1), (1, 9), (1, 40), (1, 80), (2, 4), (2, 20), (2, 40))

    @torch.inference_mode()
    def warm_prefill(self) -> int:
        """Compile the prefill shapes requests meet, on scratch slots before any request runs."""
        if not self.compile_prefill:
            return 0
        done = 0
        padded, self.prefill_padded = self.prefill_padded, False  # the unpadded shapes' regions
        try:
            for rows, length in self.WARM_PREFILLS:
                if rows <= self.slots and length <= self.max_len:
                    self._scratch_prefill(rows, length)
                    done += 1
        finally:
            self.prefill_padded = padded
        return done

    @torch.inference_mode()
    def keep_kv(self, slot: int, length: int) -> torch.Tensor:
        """A copy of the first ``length`` cache positions of ``slot`` (conversation KV)."""
        return copy_out(self.cache, slot=slot, length=length)

    @torch.inference_mode()
    def restore_kv(self, kv: torch.Tensor, slot: int, length: int) -> None:
        """Put the first ``length`` positions of a ``keep_kv`` copy back, into ``slot``."""
        copy_in(self.cache, kv, slot=slot, length=length)

    @torch.inference_mode()
    def move(self, src: int, dst: int, length: int) -> None:
        """Copy row ``src`` (cache and row state) into slot ``dst``."""
        self.cache.move(src, dst, length)
        for table in (self.last_ids, self.lengths, self.rope_delta, self.extra):
            table[dst] = table[src]


def prefill_after_kept(
    decoder: SlotDecoder,
    *,
    slots: list[int],
    prompts: list[tuple[torch.Tensor, torch.Tensor]],
    kept: list[Any],
    offsets: list[int],
    want_hidden: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Prefill each row's prompt (``embeds [L, H]``, ``positions [3, L]``) into its slot after the
    first ``offsets[i]`` positions of its kept KV (``kept[i]``, a ``keep_kv`` copy, restored here;
    0: none). Fresh rows run as one right-padded batch, rows after a kept prefix as suffix batches
    (``kept_kv.suffix_groups``). Returns each row's last position's logits [n, V] in row order and,
    when asked, its final-norm hidden state there [n, H]."""
    for slot, copy, offset in zip(slots, kept, offsets, strict=True):
        if offset:
            decoder.restore_kv(copy, slot, offset)
    lengths = [embeds.shape[0] for embeds, _ in prompts]
    fresh = [i for i, offset in enumerate(offsets) if not offset]
    after = [i for i, offset in enumerate(offsets) if offset]
    batches = [(fresh, False)] if fresh else []
    for group in suffix_groups([offsets[i] for i in after], [lengths[i] for i in after], decoder.max_len):
        batches.append(([after[k] for k in group], True))
    logits: list[Any] = [None] * len(prompts)
    last: list[Any] = [None] * len(prompts)
    for which, suffix in batches:
        embeds, positions = right_padded(
            [(prompts[i][0][offsets[i] :], prompts[i][1][:, offsets[i] :]) for i in which],
            dtype=decoder.dtype,
            device=decoder.device,
        )
        rows_logits, hidden = decoder.prefill(
            slots=[slots[i] for i in which],
            embeds=embeds,
            positions=positions,
            lengths=[lengths[i] - offsets[i] for i in which],
            want_hidden=want_hidden,
            offsets=[offsets[i] for i in which] if suffix else None,
        )
        for k, i in enumerate(which):
            logits[i] = rows_logits[k : k + 1]
            if hidden is not None:
                last[i] = hidden[k, lengths[i] - offsets[i] - 1][None]
    return torch.cat(logits), torch.cat(last) if want_hidden else None
