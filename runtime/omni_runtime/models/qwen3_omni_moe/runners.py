"""The Qwen3-Omni-MoE thinker runner: the Qwen2.5 one plus DeepStack visual features at prefill.

Qwen3-Omni's vision tower hands the thinker, besides the merged patch embeddings scattered at
the image/video placeholders, one more feature per placeholder for each of its DeepStack layers
(``deepstack_visual_indexes``); the text model adds feature ``i`` to its hidden states after
decoder layer ``i``, at the visual positions only. Prompts carry them in
``talker_context["deepstack"]`` as (positions [n], features [n, k, H]) from mm_aggregate; decode
steps never see visual tokens, so only prefill changes.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_runtime.contract.adapter import ThinkerAdmission
from omni_runtime.models.qwen2_5_omni.runners import QwenThinkerRunner

DEEPSTACK = "deepstack"


class Qwen3ThinkerRunner(QwenThinkerRunner):
    def prefill_hook(self, rows: list[ThinkerAdmission], offset: int = 0) -> Any:
        row_index, positions, features = [], [], []
        for i, row in enumerate(rows):
            deep = row.prompt.talker_context.get(DEEPSTACK)
            if deep is None:
                continue
            where, values = deep
            if offset:  # kept KV covers the first positions: the prefill starts at ``offset``
                inside = where >= offset
                where, values = where[inside] - offset, values[inside]
            row_index.append(torch.full_like(where, i))
            positions.append(where)
            features.append(values)
        if not features:
            return None
        index = (torch.cat(row_index).to(self.device), torch.cat(positions).to(self.device))
        stacked = torch.cat(features).to(self.device, self.decoder.dtype)  # [n, k, H]
        depth = stacked.shape[1]

        def add(layer: int, hidden: torch.Tensor) -> torch.Tensor:
            if layer >= depth:
                return hidden
            return hidden.index_put(index, stacked[:, layer], accumulate=True)

        return add
