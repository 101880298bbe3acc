"""Where a warm prefill's time goes, per stack (thinker, talker) and shape.

Run by hand on the device machine. Starts the engine in-process as ``omni serve`` does (load and
warm-up), then prefills each shape into scratch slots of the idle decoders: the wall time of a warm
call (median of five, the GPU finished), then one call under the CUDA profiler with its kernels'
time summed by kind (MoE experts, other GEMMs, attention, Triton, the rest) and the heaviest
kernels. A prefill is an admission: the first text of every reply in a burst waits for one. Each
shape runs unpadded (the baseline) and, where the decoder pads fresh prompts to CUDA graphs
(``SlotDecoder.prefill_padded``), as its bucket's graph.

    python tests/gpu/profile_prefill.py --model-path DIR --load-format dummy [--shapes 1x64,16x64]

A released shape with random weights: ``omni tiny-checkpoint [--family qwen3_omni_moe] --shape
released DIR``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from typing import Any

import torch
from prefill_shapes import prefill_scratch  # tests/gpu, beside this script

from omni_runtime.contract.options import EngineOptions
from omni_runtime.pipeline import build_engine

KINDS = (  # first match names a kernel's kind
    ("experts", ("grouped", "moe", "expert")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn")),
    ("gemm", ("gemm", "cutlass", "nvjet", "xmma", "cublas")),
    ("triton", ("triton",)),
)


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, words in KINDS:
        if any(w in low for w in words):
            return kind
    return "other"


def sync() -> None:
    torch.cuda.synchronize()


def wall_ms(decoder: Any, rows: int, length: int) -> float:
    sync()
    began = time.perf_counter()
    prefill_scratch(decoder, rows, length, 0)
    sync()
    return (time.perf_counter() - began) * 1000


def kernels(decoder: Any, rows: int, length: int) -> tuple[dict[str, float], list[tuple[str, float, int]]]:
    """GPU ms per kind and the heaviest kernels (name, ms, count) of one prefill."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        prefill_scratch(decoder, rows, length, 0)
        sync()
    per_kind: dict[str, float] = {}
    rows_out: list[tuple[str, float, int]] = []
    for event in prof.key_averages():
        if getattr(event, "device_type", None) is None or "CUDA" not in str(event.device_type):
            continue
        ms = event.self_device_time_total / 1000
        if ms <= 0:
            continue
        per_kind[kind_of(event.key)] = per_kind.get(kind_of(event.key), 0.0) + ms
        rows_out.append((event.key, ms, event.count))
    rows_out.sort(key=lambda r: r[1], reverse=True)
    return per_kind, rows_out


def differences(decoder: Any, rows: int, length: int) -> str:
    """``SlotDecoder.prefill_differences`` of one random prefill (graph against unpadded), printed."""
    generator = torch.Generator(device=decoder.device).manual_seed(rows * 1000 + length)
    found = decoder.prefill_differences(rows, length, generator)
    return ", ".join(
        f"{name} {'yes' if value else 'NO'}" if name == "argmax equal" else f"{name} {value:.3g}"
        for name, value in found.items()
    )


def main_shapes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        rows, _, length = part.partition("x")
        out.append((int(rows), int(length)))
    return out


async def main(args: argparse.Namespace) -> None:
    # The start-up check of the captured graphs logs its verdict here ("prefill graphs checked").
    check_log = logging.getLogger("omni_runtime.executor.slot_cache")
    check_log.setLevel(logging.INFO)
    check_log.addHandler(logging.StreamHandler())
    engine = build_engine(
        EngineOptions(
            model_path=args.model_path,
            load_format=args.load_format,
            device="cuda",
            dtype="bfloat16",
            pipeline="streaming-speech",
            max_batch_size=32,
        )
    )
    began = time.perf_counter()
    await engine.start()
    print(f"engine started and warm in {time.perf_counter() - began:.1f} s", flush=True)
    local = engine.stages.local
    decoders = {"thinker": local.thinker.runner.decoder, "talker": local.talker.runner.decoder}
    for name, decoder in decoders.items():
        decoder.prefill_graphs = decoder.prefill_padded = (
            True  # as start-up leaves them (unless OMNI_PREFILL_GRAPHS=0)
        )
        with torch.inference_mode():
            print(f"{name}: {decoder.capture_prefills()} prefill graphs captured", flush=True)
        for rows, length in main_shapes(args.shapes):
            print(
                f"{name} {rows}x{length} graph against unpadded (relative): {differences(decoder, rows, length)}"
            )
            if rows > decoder.slots or length + 2 > decoder.max_len:
                continue
            graphs = decoder.prefill_padded
            for padded in (False, True) if graphs else (False,):  # unpadded: the baseline, same run
                decoder.prefill_padded = padded
                for _ in range(2):
                    wall_ms(decoder, rows, length)
                wall = statistics.median(wall_ms(decoder, rows, length) for _ in range(5))
                per_kind, heavy = kernels(decoder, rows, length)
                gpu = sum(per_kind.values())
                split = ", ".join(f"{k} {v:.1f}" for k, v in sorted(per_kind.items(), key=lambda kv: -kv[1]))
                how = "graph" if padded else "unpadded"
                print(
                    f"{name} {rows}x{length} {how}: wall {wall:.1f} ms, kernels {gpu:.1f} ms ({split})",
                    flush=True,
                )
                for key, ms, count in heavy[: args.top]:
                    print(f"    {ms:7.2f} ms x{count:<5d} {key[:110]}")
            decoder.prefill_padded = graphs
    await engine.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--shapes", default="1x64,8x64,16x64,32x64", help="ROWSxLENGTH, comma-separated")
    parser.add_argument("--top", type=int, default=8, help="heaviest kernels printed per shape")
    asyncio.run(main(parser.parse_args()))
