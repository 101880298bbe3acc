"""The Qwen3-Omni-MoE thinker runner: the Qwen2.5 one plus DeepStack visual features at prefill,
and the thinker vectors Qwen3's talker reads.

Qwen3-Omni's vision tower hands the thinker, besides the merged patch embeddings scattered at
the image/video placeholders, one more feature per placeholder for each of its DeepStack layers
(``deepstack_visual_indexes``); the text model adds feature ``i`` to its hidden states after
decoder layer ``i``, at the visual positions only. Prompts carry them in
``talker_context["deepstack"]`` as (positions [n], features [n, k, H]) from mm_aggregate; decode
steps never see visual tokens, so only prefill changes.

The talker (talker.py) reads, as ``Qwen3OmniMoeForConditionalGeneration.generate`` hands them
over: per prompt position the thinker's input embedding at text tokens and its hidden state after
decoder layer ``accept_hidden_layer`` at media placeholders (transformers' ``hidden_states[k]``:
the layer's output before the DeepStack add; ``k`` = the layer count means the final-norm output),
and per reply token its input embedding only.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_runtime.contract import switches
from omni_runtime.contract.adapter import ThinkerAdmission
from omni_runtime.executor.host_copy import to_device
from omni_runtime.executor.slot_cache import add_after_layers
from omni_runtime.executor.triton_support import hopper_or_later, triton_runs_on
from omni_runtime.models.qwen2_5_omni.runners import QwenThinkerRunner
from omni_runtime.models.qwen3_omni_moe.decode_layer import fused_decode_layers, fused_decode_stack

DEEPSTACK = "deepstack"


class Qwen3ThinkerRunner(QwenThinkerRunner):
    def __init__(
        self,
        *args: Any,
        accept_layer: int,
        decode_layer: str | None = None,
        decode_step: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        # Decode steps of a few rows in six fused kernels a layer where Triton runs
        # (decode_layer.py); ``decode_layer`` (else OMNI_MOE_LAYER): pdl, fused or off.
        mode = switches.choice("OMNI_MOE_LAYER") if decode_layer is None else decode_layer
        if mode == "pdl" and not hopper_or_later(self.device):
            mode = "fused"  # programmatic dependent launch is Hopper's (sm_90)
        if triton_runs_on(torch.empty(0, device=self.device)):
            self.decoder.decode_layers = fused_decode_layers(
                self.decoder.layers, self.decoder.step_layers, mode
            )
        # One-row steps with every layer in one kernel on Hopper (``decode_step``, else
        # OMNI_MOE_STEP_KERNEL), where the fused layers run.
        if decode_step is None:
            decode_step = switches.flag("OMNI_MOE_STEP_KERNEL")
        if decode_step and self.decoder.decode_layers is not None:
            self.decoder.decode_stack = fused_decode_stack(self.decoder.decode_layers, pdl=mode == "pdl")
        self.accept_layer = accept_layer
        self.layer_count = len(self.decoder.layers)
        # Every prefill keeps the accept layer's output (before the DeepStack add, as transformers
        # records it) for the talker's prompt vectors: ``decoder.kept_hidden``.
        if 0 < accept_layer < self.layer_count:
            self.decoder.keep_layer = accept_layer - 1

    def prefill_hook(self, rows: list[ThinkerAdmission], offsets: list[int] | None = None) -> Any:
        deep = self._deepstack(rows, offsets)
        if deep is None:
            return None
        hook = add_after_layers(*deep)
        # Under thinker TP every rank adds the same features (tp_runner broadcasts them).
        hook.deepstack = deep  # type: ignore[attr-defined]
        return hook

    def _deepstack(self, rows: list[ThinkerAdmission], offsets: list[int] | None = None) -> Any:
        """(batch rows [n], positions [n]) and the features [n, k, H] of this prefill, or None."""
        row_index, positions, features = [], [], []
        for i, row in enumerate(rows):
            deep = row.prompt.talker_context.get(DEEPSTACK)
            if deep is None:
                continue
            where, values = deep
            offset = offsets[i] if offsets is not None else 0
            if offset:  # kept KV covers the row's first positions: its prefill starts at ``offset``
                inside = where >= offset
                where, values = where[inside] - offset, values[inside]
            row_index.append(torch.full_like(where, i))
            positions.append(where)
            features.append(values)
        if not features:
            return None
        index = torch.stack([torch.cat(row_index), torch.cat(positions)]).to(self.device, torch.int64)
        return index, torch.cat(features).to(self.device, self.decoder.dtype)  # [2, n], [n, k, H]

    def prompt_vectors(
        self, k: int, ids: list[int], embeds: torch.Tensor, hidden: torch.Tensor
    ) -> torch.Tensor:
        """Input embeddings at text positions, the accepted layer's hidden state (captured during
        this prefill, batch row ``k``) at media ones."""
        length = embeds.shape[0]
        if self.accept_layer == 0:
            return embeds.clone()
        kept = self.decoder.kept_hidden
        source = hidden if kept is None else kept[k, :length]
        is_media = to_device([i in self.media_id_set for i in ids], self.device, torch.bool)[:, None]
        return torch.where(is_media, source.to(embeds.dtype), embeds)

    def reply_vectors(self, out: Any, index: Any) -> Any:
        return out.inputs[index]  # the reply token's input embedding (a fresh tensor)
