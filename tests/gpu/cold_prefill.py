"""Does a prefill shape cost more the first time it comes, with nothing compiled?

Run by hand on the device machine. Starts the engine in-process as ``omni serve`` does (load,
warm-up, heap frozen) and prefills each shape of a realtime conversation into scratch slots of the
idle thinker and talker: rows of growing prompts re-prefilled whole (turn N without kept KV) and
one-row suffixes after a kept prefix (turn N with it), then long prompts. Each shape runs three
times: the same shape again shows a cost paid once per shape (a library's per-shape plan), its
neighbour (one token longer) whether every new length pays it. A shape whose first call is much
slower than its second is profiled again at a fresh length, and the CPU ops that took the time
are printed.

    python tests/gpu/cold_prefill.py --model-path DIR [--load-format dummy]

A released shape with random weights: ``omni tiny-checkpoint --shape released DIR``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import torch
from prefill_shapes import prefill_scratch  # tests/gpu, beside this script

from omni_runtime.contract.options import EngineOptions
from omni_runtime.pipeline import build_engine
from omni_runtime.support.gc_pauses import freeze_heap

# (rows, length, kept prefix), in the order a 4-turn realtime conversation of 8 sessions meets them.
SHAPES = [
    (8, 118, 0),
    (8, 187, 0),
    (8, 255, 0),
    (8, 257, 0),
    (8, 324, 0),
    (1, 65, 122),
    (1, 70, 194),
    (1, 66, 259),
    (8, 600, 0),
    (1, 1200, 0),
    (2, 2000, 0),
    (1, 3500, 0),
]


def sync(decoder: Any) -> None:
    if decoder.device.type == "cuda":
        torch.cuda.synchronize(decoder.device)


def prefill(decoder: Any, rows: int, length: int, offset: int) -> float:
    """One prefill of the shape into slots 0..rows-1; wall ms, the GPU finished."""
    sync(decoder)
    began = time.perf_counter()
    prefill_scratch(decoder, rows, length, offset)
    sync(decoder)
    return (time.perf_counter() - began) * 1000


def top_ops(decoder: Any, rows: int, length: int, offset: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        prefill(decoder, rows, length, offset)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:5]
    return ", ".join(f"{e.key} {e.self_cpu_time_total / 1000:.1f} ms x{e.count}" for e in events)


def measure(decoders: dict[str, Any], *, shift: int) -> None:
    print("stack    rows length prefix   first  again  next length (ms)")
    for name, decoder in decoders.items():
        fresh = 7
        for rows, base, offset in SHAPES:
            length = base + shift
            if rows > decoder.slots or offset + length + 2 > decoder.max_len:
                continue
            first = prefill(decoder, rows, length, offset)
            again = prefill(decoder, rows, length, offset)
            neighbour = prefill(decoder, rows, length + 1, offset)
            print(
                f"{name:8s} {rows:4d} {length:6d} {offset:6d}  {first:6.1f} {again:6.1f} {neighbour:6.1f}",
                flush=True,
            )
            if first > 2 * again + 20:
                fresh += 1
                if offset + length + fresh < decoder.max_len:
                    ops = top_ops(decoder, rows, length + fresh, offset)
                    print(f"         cold again at length {length + fresh}: {ops}")


async def main(args: argparse.Namespace) -> None:
    engine = build_engine(
        EngineOptions(
            model_path=args.model_path,
            load_format=args.load_format,
            device=args.device,
            dtype=args.dtype,
            pipeline="streaming-speech",
            max_batch_size=32,
        )
    )
    began = time.perf_counter()
    await engine.start()
    print(f"engine started and warm in {time.perf_counter() - began:.1f} s", flush=True)
    freeze_heap("cold_prefill")
    print(
        "sdpa backends enabled: flash",
        torch.backends.cuda.flash_sdp_enabled(),
        "mem_efficient",
        torch.backends.cuda.mem_efficient_sdp_enabled(),
        "cudnn",
        torch.backends.cuda.cudnn_sdp_enabled(),
        "math",
        torch.backends.cuda.math_sdp_enabled(),
    )
    local = engine.stages.local
    decoders = {"thinker": local.thinker.runner.decoder, "talker": local.talker.runner.decoder}
    measure(decoders, shift=0)
    if torch.backends.cuda.cudnn_sdp_enabled():  # the same at fresh lengths, cuDNN's attention off
        torch.backends.cuda.enable_cudnn_sdp(False)
        print("again at lengths + 3, with cuDNN's attention disabled")
        measure(decoders, shift=3)
    await engine.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of the script itself")
    parser.add_argument("--dtype", default="bfloat16")
    asyncio.run(main(parser.parse_args()))
