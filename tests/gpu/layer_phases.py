"""Where inside each kernel of the fused MoE decode layer the time goes (issue 17), from the
programs' own clocks: every program of the six kernels stores the GPU's global timer at its entry,
past its wait for the kernel before (PDL), at its own phase points and at its end
(``moe_layer_kernels.mark``, compiled in only when traced). Several layer calls run as a chain in
one CUDA graph, as in a decode step; per kernel, medians over the calls of:

- entry: when its first / last program started, from the previous kernel's last program's end
  (negative: before it, PDL's early launch);
- released: when its programs got past the wait (first, median, last), from that same end;
- done: when its last program ended, from that end (what the kernel adds to the chain);
- the attention's and the router's own phases, median over their programs.

Run by hand on the device machine (the released Qwen3-Omni thinker layer, random weights):

    python tests/gpu/layer_phases.py --rows 1,4 --cached 128,2048 --out /tmp/phases.txt
"""

from __future__ import annotations

import argparse
import statistics

import torch
from cuda_graphs import capture
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf

from omni_runtime.executor import moe_layer
from omni_runtime.executor.slot_cache import SlotKVCache
from omni_runtime.models.qwen3_omni_moe.attention import fuse_qkv
from omni_runtime.models.qwen3_omni_moe.config import released_30b_a3b_config
from omni_runtime.models.qwen3_omni_moe.decode_layer import fused_decode_layers

KERNELS = ("qkv", "attention", "o", "router", "gate_up", "down")
ROW_KERNELS = ("qkv", "attention", "o", "moe")  # one row with moe_experts.cu: its marks in the router's slot
# Own phases: (name, from mark, to mark, over programs "all" or the "last" one to finish)
PHASES = {
    "attention": (("q/k norms, rotary, new key stored", 1, 2), ("split's keys", 2, 3), ("counter", 3, 4)),
    "router": (("norm and logits", 1, 3), ("counter", 3, 4)),
    "moe": (
        ("norm and logits", 1, 2), ("all logits and routing", 2, 3), ("gate-up stream", 3, 4),
        ("every activation read", 4, 6), ("down rows' wait", 6, 7), ("down", 7, 5),
    ),
}  # fmt: skip
ROW_PHASES = PHASES | {  # row_gemv.cu's marks for o (the Triton kernel marks entry, wait and end only)
    "o": (("x's loads issued", 1, 3), ("weights' wait", 3, 2), ("dots", 2, 5)),
}
COUNTED = ("attention", "router")  # kernels whose last program to count itself done merges or routes
CALLS = 8


def layer_stack() -> tuple[object, torch.nn.ModuleList, object]:
    text = released_30b_a3b_config().thinker_config.text_config
    text._experts_implementation, text._attn_implementation = "grouped_mm", "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        layers = torch.nn.ModuleList([hf.Qwen3OmniMoeThinkerTextDecoderLayer(text, 0)]).to(torch.bfloat16)
        with torch.no_grad():
            for name, param in layers.named_parameters():
                noise = torch.randn_like(param)
                param.copy_(1 + 0.1 * noise if "norm" in name else noise / param.shape[-1] ** 0.5)
        rotary = hf.Qwen3OmniMoeThinkerTextRotaryEmbedding(text)
    fuse_qkv(layers)
    return text, layers, rotary


def measure(text, layers, rotary, rows: int, cached: int) -> list[str]:
    view = cached + 64
    cache = SlotKVCache(
        layers=1, slots=4, kv_heads=text.num_key_value_heads, max_len=view, head_dim=text.head_dim,
        dtype=torch.bfloat16, device="cuda",
    )  # fmt: skip
    cache.keys[0].normal_()
    cache.values[0].normal_()
    cache.write_pos = torch.full((rows,), cached, device="cuda")
    cache.view_len = view
    cache.layer_keys, cache.layer_values = cache.keys[0], cache.values[0]
    hidden = torch.randn(rows, 1, text.hidden_size, device="cuda", dtype=torch.bfloat16)
    cos_sin = rotary(hidden, cache.write_pos.view(1, rows, 1).expand(3, rows, 1))
    chain = []
    for _ in range(CALLS):
        fused = fused_decode_layers(layers, list(layers), "pdl")
        assert fused is not None
        fused[0].trace = moe_layer.trace_buffer("cuda")
        chain.append(fused[0])

    def step() -> torch.Tensor:
        h = hidden
        for layer in chain:
            h = layer(h, attention_mask=None, position_embeddings=cos_sin, past_key_values=cache)
        return h

    with torch.no_grad():
        graph = capture(step)
        for _ in range(5):
            graph.replay()
        for layer in chain:
            assert layer.trace is not None
            layer.trace.zero_()
        graph.replay()
        torch.cuda.synchronize()
    kernels = ROW_KERNELS if rows == 1 and chain[0].row is not None else KERNELS
    return analyse([layer.trace.cpu() for layer in chain], rows, cached, kernels)  # type: ignore[union-attr]


def analyse(
    marks: list[torch.Tensor], rows: int, cached: int, kernels: tuple[str, ...] = KERNELS
) -> list[str]:
    """The table of ``measure`` from each chained call's marks ([kernels, programs, 8], ns)."""
    rows_out: dict[str, list[list[float]]] = {}
    previous_end: int | None = None
    phases = ROW_PHASES if kernels == ROW_KERNELS else PHASES
    for trace in marks:
        for k, name in enumerate(kernels):
            t = trace[k]
            used = t[:, 0] > 0
            t = t[used]
            end = int(t[:, 5].max())
            if previous_end is not None:
                rel = (t.double() - previous_end) / 1000.0  # µs from the previous kernel's end
                row = [
                    float(rel[:, 0].min()), float(rel[:, 0].max()),
                    float(rel[:, 1].min()), float(rel[:, 1].median()), float(rel[:, 1].max()),
                    float(rel[:, 5].max()), float(used.sum()),
                ]  # fmt: skip
                for _label, a, b in phases.get(name, ()):
                    row.append(float(((t[:, b] - t[:, a]).double() / 1000.0).median()))
                if name in COUNTED:  # the last program's finish after its counter
                    last = int(t[:, 5].argmax())
                    row.append(float((t[last, 5] - t[last, 4]) / 1000.0))
                rows_out.setdefault(name, []).append(row)
            previous_end = end
    lines = [
        f"rows {rows}, {cached} cached tokens: µs from the previous kernel's last program's end, medians over "
        f"{CALLS - 1} chained calls",
        f"{'kernel':10} {'programs':>8} {'entry first/last':>17} {'released first/median/last':>27} {'done':>6}",
    ]
    added = 0.0
    for name in kernels:
        table = rows_out[name]
        med = [statistics.median(col) for col in zip(*table, strict=True)]
        added += med[5]
        lines.append(
            f"{name:10} {med[6]:8.0f} {med[0]:8.2f}/{med[1]:<8.2f} {med[2]:8.2f}/{med[3]:.2f}/{med[4]:<8.2f} {med[5]:6.2f}"
        )
        for (label, _a, _b), value in zip(phases.get(name, ()), med[7:], strict=False):
            lines.append(f"{'':10} own phase, median program: {label}: {value:.2f}")
        if name in COUNTED:
            lines.append(
                f"{'':10} the last program, counter to end (the merge or the routing): {med[-1]:.2f}"
            )
    lines.append(f"layer (sum of done): {added:.2f} µs")
    stamps = torch.unique(torch.cat([trace[trace > 0] for trace in marks]))  # sorted
    steps = torch.unique(stamps.diff())[:5].tolist()
    lines.append(f"the clock's smallest steps between distinct marks (ns): {steps}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,4")
    parser.add_argument("--cached", default="128,2048")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    text, layers, rotary = layer_stack()
    lines: list[str] = [torch.cuda.get_device_name()]
    for rows in (int(r) for r in args.rows.split(",")):
        for cached in (int(c) for c in args.cached.split(",")):
            lines += [*measure(text, layers, rotary, rows, cached), ""]
            print("\n".join(lines[-len(KERNELS) - 12 :]), flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
