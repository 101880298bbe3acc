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


def shadow_padded_prefills(decoder: Any, name: str, log: list[dict[str, Any]]) -> Any:
    """Wrap ``decoder.prefill`` (an instance attribute; returns the original to put back): a padded
    call (a CUDA graph where captured) runs unpadded first on the same slots, then padded, so the
    cache keeps the padded call's writes. Each appends to ``log``: the stack, the shape, the largest
    difference of logits, hidden states and kept layer relative to the unpadded values, and
    whether every row's argmax agrees."""
    import torch

    prefill = decoder.prefill

    def rel(a: Any, b: Any) -> float:
        return float((b.float() - a.float()).abs().max()) / (float(a.float().abs().max()) or 1.0)

    def checked(**kwargs: Any) -> Any:
        flag = "suffix_padded" if any(kwargs.get("offsets") or ()) else "prefill_padded"
        if not getattr(decoder, flag):
            return prefill(**kwargs)
        setattr(decoder, flag, False)
        try:
            want_logits, want_hidden = prefill(**{**kwargs, "want_hidden": True})
            want_kept = None if decoder.kept_hidden is None else decoder.kept_hidden.clone()
        finally:
            setattr(decoder, flag, True)
        logits, hidden = prefill(**{**kwargs, "want_hidden": True})
        lengths = kwargs["lengths"]
        entry = {
            "stack": name,
            "lengths": list(lengths),
            "width": int(kwargs["embeds"].shape[1]),
            "offsets": list(kwargs.get("offsets") or ()),
            "logits": rel(want_logits, logits),
            "hidden": max(rel(want_hidden[r, :n], hidden[r, :n]) for r, n in enumerate(lengths)),
            "argmax same": bool(torch.equal(want_logits.argmax(-1), logits.argmax(-1))),
        }
        if want_kept is not None and decoder.kept_hidden is not None:
            kept = decoder.kept_hidden
            entry["kept"] = max(rel(want_kept[r, :n], kept[r, :n]) for r, n in enumerate(lengths))
        log.append(entry)
        return logits, (hidden if kwargs["want_hidden"] else None)

    decoder.prefill = checked
    return prefill
