"""The MoE experts call alone on a GPU: transformers' ``grouped_mm`` against the runtime's fused
decode kernels (executor.moe_decode) at several launch configurations, per batch of rows.

    python -m omni_runtime.bench.moe_kernel --rows 1,2,4,8,16 --json moe-kernel.json

Shapes default to the Qwen3-Omni-30B-A3B thinker (128 experts, hidden 2048, 768 per expert,
top-8, bfloat16). Each timing replays a CUDA graph of ``--calls`` experts calls that cycle over
``--layers`` separate layers' weights with fresh routing per call, so the experts are read from
HBM as in a decode step, not from L2. Reported: microseconds per call and the bandwidth it
reaches over the bytes of the distinct experts the call reads (the bound of a call).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

CANDIDATES = [  # (gate_rows, gate_cols, down_rows, down_cols, warps)
    (8, 512, 4, 256, 4),
    (8, 512, 4, 1024, 4),
    (8, 512, 8, 1024, 4),
    (8, 512, 2, 1024, 4),
    (8, 512, 4, 1024, 2),
    (8, 512, 16, 1024, 8),
    (8, 512, 8, 512, 4),
    (8, 512, 4, 512, 4),
    (4, 512, 4, 1024, 4),
    (8, 1024, 4, 1024, 4),
    (16, 512, 8, 1024, 8),
    (16, 512, 8, 512, 8),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m omni_runtime.bench.moe_kernel", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rows", default="1,2,4,8,16")
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=768)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--layers", type=int, default=6, help="separate weight sets cycled through")
    parser.add_argument("--calls", type=int, default=48, help="experts calls per captured graph")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("moe_kernel: needs a CUDA GPU", file=sys.stderr)
        return 2
    from transformers import Qwen3OmniMoeConfig
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf

    from omni_runtime.executor import moe_decode
    from omni_runtime.executor.moe_decode import LaunchConfig

    moe_decode.register()
    text: Any = Qwen3OmniMoeConfig().thinker_config.text_config  # type: ignore[union-attr]
    text.num_experts, text.hidden_size = args.experts, args.hidden
    text.moe_intermediate_size, text.num_experts_per_tok = args.intermediate, args.top_k
    torch.manual_seed(0)
    layers = []
    with torch.device("cuda"):
        for _ in range(args.layers):
            module: Any = hf.Qwen3OmniMoeThinkerTextExperts(text).to(torch.bfloat16)
            torch.nn.init.normal_(module.gate_up_proj, std=0.02)
            torch.nn.init.normal_(module.down_proj, std=0.02)
            module.config._experts_implementation = "grouped_mm"
            layers.append(module)
    expert_bytes = (layers[0].gate_up_proj[0].numel() + layers[0].down_proj[0].numel()) * layers[
        0
    ].gate_up_proj.element_size()

    def time_us(rows: int, run: Any) -> tuple[float, float]:
        xs = [torch.randn(rows, args.hidden, device="cuda", dtype=torch.bfloat16) for _ in range(args.calls)]
        routes = []
        distinct = 0
        for _ in range(args.calls):
            probs = torch.softmax(torch.randn(rows, args.experts, device="cuda"), -1)
            weights, index = torch.topk(probs, args.top_k)
            routes.append(((weights / weights.sum(-1, keepdim=True)).to(torch.bfloat16), index))
            distinct += int(index.unique().numel())
        calls = [(layers[i % len(layers)], xs[i], *routes[i]) for i in range(args.calls)]
        with torch.no_grad():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for layer, x, w, idx in calls:
                    run(layer, x, idx, w)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for layer, x, w, idx in calls:
                    run(layer, x, idx, w)
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        reps = 20
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        us = start.elapsed_time(end) * 1000 / (reps * args.calls)
        gbps = distinct / args.calls * expert_bytes / (us * 1e-6) / 1e9
        return us, gbps

    from transformers.integrations.moe import grouped_mm_experts_forward

    results: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "shape": vars(args), "rows": []}
    print(
        f"MoE experts call on {results['gpu']}: E={args.experts} H={args.hidden} I={args.intermediate} k={args.top_k}"
    )
    for rows in [int(r) for r in args.rows.split(",")]:
        entry: dict[str, Any] = {"rows": rows}
        us, gbps = time_us(rows, lambda layer, x, idx, w: grouped_mm_experts_forward(layer, x, idx, w))
        entry["grouped_mm"] = {"us": us, "gbps": gbps}
        print(f"rows {rows:3d}: grouped_mm {us:8.1f} us {gbps:7.0f} GB/s")
        fused: list[dict[str, Any]] = []
        default = moe_decode.launch_config(rows, args.hidden, args.intermediate, args.top_k)
        candidates = [default, *(LaunchConfig(*c) for c in CANDIDATES if LaunchConfig(*c) != default)]
        for cfg in candidates:

            def run(layer, x, idx, w, cfg=cfg):
                return moe_decode.fused_experts(x, idx, w, layer.gate_up_proj, layer.down_proj, config=cfg)

            us, gbps = time_us(rows, run)
            fused.append(
                {"config": list(cfg.__dict__.values()), "us": us, "gbps": gbps, "default": cfg == default}
            )
            print(
                f"           fused {cfg} {us:8.1f} us {gbps:7.0f} GB/s{'  (default)' if cfg == default else ''}"
            )
        entry["fused"] = fused
        best = min(fused, key=lambda f: f["us"])
        entry["best"] = best
        print(f"           best {best['config']} {best['us']:.1f} us; default {fused[0]['us']:.1f} us")
        results["rows"].append(entry)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
