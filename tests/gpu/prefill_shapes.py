"""A table of prefill shapes that meets every region the compiled decoder layers guard on, and a
check that none of them compiles after start-up (used by the GPU tests of both families).

A shape missed by the warm-up (``SlotDecoder.WARM_PREFILLS``) is compiled by the first request
that brings it: every layer traced again while the whole batch waits (seconds).
"""

from __future__ import annotations

from typing import Any

# (rows, length, kept prefix): one row and several, tokens per call around 16 (an MoE block's fused
# path) and 64 (inductor's matmul padding), long prompts and big batches, suffixes after a prefix.
PREFILL_SHAPES = [
    *((rows, length, 0) for rows in (1, 2, 3, 5, 8) for length in (1, 3, 8, 16, 17, 30, 33, 64, 65, 200)),
    (8, 400, 0),
    (4, 900, 0),
    *((1, length, 20) for length in (1, 16, 17, 63, 64, 200, 500)),
]


def prefill_scratch(decoder: Any, rows: int, length: int, offset: int) -> None:
    """Random embeddings of ``rows`` x ``length`` prefilled into slots ``0..rows-1`` of an idle
    decoder, after ``offset`` kept positions. Made outside inference mode, as an admission's can be."""
    import torch

    hidden = decoder.out_hidden.shape[-1]
    embeds = torch.randn(rows, length, hidden, dtype=decoder.dtype, device=decoder.device)
    positions = torch.arange(offset, offset + length, device=decoder.device).view(1, 1, -1)
    decoder.prefill(
        slots=list(range(rows)),
        embeds=embeds,
        positions=positions.expand(3, rows, -1),
        lengths=[length] * rows,
        want_hidden=False,
        offsets=[offset] * rows,
    )


def compiled_shapes(decoders: dict[str, Any]) -> list[tuple[str, int, int, int]]:
    """Prefill every shape into scratch slots of each idle decoder; the (stack, rows, length, kept
    prefix) of those that compiled. The embeddings are made outside inference mode, as an
    admission's can be."""
    from torch._dynamo.utils import counters

    compiled: list[tuple[str, int, int, int]] = []
    for name, decoder in decoders.items():
        for rows, length, offset in PREFILL_SHAPES:
            if rows > decoder.slots or offset + length > decoder.max_len:
                continue
            before = counters["stats"]["unique_graphs"]
            prefill_scratch(decoder, rows, length, offset)
            if counters["stats"]["unique_graphs"] != before:
                compiled.append((name, rows, length, offset))
    return compiled
