"""Launch the one-row MoE kernel (executor/moe_experts.cu) traced, whose waits give up instead of
hanging, and print how far each block got and what any wait saw (run by hand on the device)."""

from __future__ import annotations

import torch
from layer_phases import layer_stack

from omni_runtime.executor import moe_layer
from omni_runtime.executor.slot_cache import SlotKVCache
from omni_runtime.models.qwen3_omni_moe.decode_layer import fused_decode_layers


def main() -> int:
    text, layers, rotary = layer_stack()
    cache = SlotKVCache(
        layers=1, slots=4, kv_heads=text.num_key_value_heads, max_len=256, head_dim=text.head_dim,
        dtype=torch.bfloat16, device="cuda",
    )  # fmt: skip
    cache.write_pos, cache.view_len = torch.tensor([100], device="cuda"), 256
    cache.layer_keys, cache.layer_values = cache.keys[0], cache.values[0]
    hidden = torch.randn(1, 1, text.hidden_size, device="cuda", dtype=torch.bfloat16)
    cos_sin = rotary(hidden, cache.write_pos.view(1, 1, 1).expand(3, 1, 1))
    failed = 0
    for mode in ("fused", "pdl"):
        fused = fused_decode_layers(layers, list(layers), mode)
        assert fused is not None and fused[0].row is not None
        layer = fused[0]
        layer.trace = moe_layer.trace_buffer("cuda")
        for launch in range(3):
            layer.trace.zero_()
            with torch.no_grad():
                out = layer(hidden, attention_mask=None, position_embeddings=cos_sin, past_key_values=cache)
            torch.cuda.synchronize()
            marks = layer.trace[3].cpu()
            blocks = layer.row.plan.blocks
            reached = [int((marks[:blocks, at] > 0).sum()) for at in range(8)]
            reports = marks[blocks : 2 * blocks]
            bad = [(b, reports[b].tolist()) for b in range(blocks) if reports[b].any()]
            print(
                f"{mode} launch {launch}: blocks reaching marks 0-7 {reached}; launches now "
                f"{int(layer.row.launches.item())}; out finite {bool(out.isfinite().all())}; "
                f"{len(bad)} blocks reported: {bad[:6]}",
                flush=True,
            )
            failed += len(bad)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
