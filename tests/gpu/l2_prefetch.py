"""The fused MoE decode layer with and without its L2 prefetches (issue 17), on the device machine:

    python tests/gpu/l2_prefetch.py --layers 24 --rows 1,4 --out /tmp/prefetch.txt

``LAYERS`` distinct layers of the released Qwen3-Omni thinker (random weights, so no layer finds
another's weights in L2, as in a real step) run as one PDL chain in a CUDA graph; for each variant
of ``moe_layer.PREFETCH_DOWN`` / ``PREFETCH_NEXT`` / ``GATE_UP_EVICT`` the graph's replay time
over the layers (median of ``REPLAYS``), µs a layer, and whether the chain's output equals the
served one's bit for bit (a prefetch is only a hint). The served variant runs first and last.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch
from cuda_graphs import capture, write_report
from layer_phases import layer_stack

from omni_runtime.executor import moe_layer
from omni_runtime.executor.slot_cache import SlotKVCache
from omni_runtime.models.qwen3_omni_moe.decode_layer import fused_decode_layers

VARIANTS: list[dict[str, Any]] = [
    {},
    {"PREFETCH_DOWN": "gate_up"},
    {"PREFETCH_DOWN": "route"},
    {"PREFETCH_DOWN": "gate_up", "GATE_UP_EVICT": "evict_first"},
    {"PREFETCH_DOWN": "gate_up", "PREFETCH_NEXT": "down"},
    {"PREFETCH_DOWN": "gate_up", "PREFETCH_NEXT": "router"},
    {"PREFETCH_DOWN": "route", "PREFETCH_NEXT": "down"},
    {},
]
SERVED = {name: getattr(moe_layer, name) for v in VARIANTS for name in v}
REPLAYS = 30


def run(
    text: Any, layers: torch.nn.ModuleList, rotary: Any, rows: int, cached: int
) -> tuple[float, torch.Tensor]:
    """(µs a layer, the chain's output) for the current moe_layer settings."""
    view = cached + 64
    cache = SlotKVCache(
        layers=len(layers), slots=4, kv_heads=text.num_key_value_heads, max_len=view, head_dim=text.head_dim,
        dtype=torch.bfloat16, device="cuda",
    )  # fmt: skip
    torch.manual_seed(1)
    for t in (*cache.keys, *cache.values):
        t.normal_()
    cache.write_pos = torch.full((rows,), cached, device="cuda")
    cache.view_len = view
    hidden = torch.randn(rows, 1, text.hidden_size, device="cuda", dtype=torch.bfloat16)
    cos_sin = rotary(hidden, cache.write_pos.view(1, rows, 1).expand(3, rows, 1))
    fused = fused_decode_layers(layers, list(layers), "pdl")
    assert fused is not None

    def step() -> torch.Tensor:
        h = hidden
        for i, layer in enumerate(fused):
            cache.layer_keys, cache.layer_values = cache.keys[i], cache.values[i]
            h = layer(h, attention_mask=None, position_embeddings=cos_sin, past_key_values=cache)
        return h

    with torch.no_grad():
        out = step()  # eager: the cache write lands once, so every replay sees the same cache
        graph = capture(step)
        for _ in range(3):
            graph.replay()
        times = []
        for _ in range(REPLAYS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000 / len(layers))
        graph.replay()
        torch.cuda.synchronize()
    return statistics.median(times), out.clone()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--rows", default="1,4")
    parser.add_argument("--cached", type=int, default=128)
    parser.add_argument("--variants", type=int, default=len(VARIANTS), help="the first N variants only")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    text, layers, rotary = layer_stack(args.layers)
    lines = [f"{torch.cuda.get_device_name()}: {args.layers} layers, {args.cached} cached tokens, µs a layer"]
    print(lines[0], flush=True)
    for rows in (int(r) for r in args.rows.split(",")):
        reference = None
        for variant in VARIANTS[: args.variants]:
            for name, value in (SERVED | variant).items():
                setattr(moe_layer, name, value)
            try:
                us, out = run(text, layers, rotary, rows, args.cached)
            except Exception as exc:  # one variant that fails must not end the run
                line = f"rows {rows} {variant or 'served'}: failed: {type(exc).__name__}: {str(exc)[:300]}"
            else:
                reference = out if reference is None else reference
                same = bool(torch.equal(out, reference))
                line = f"rows {rows} {variant or 'served'}: {us:.2f} µs a layer, output as served: {same}"
            print(line, flush=True)
            lines.append(line)
            write_report(args.out, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
