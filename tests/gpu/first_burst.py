"""Is the first burst at a new concurrency slower because of work done once (compiles)?

Run by hand on the device machine. Serves a checkpoint in-process (default: the tiny Qwen3 one,
whose model time is negligible, so what remains is the engine's own overhead) and sends, at each
concurrency, the same burst of speech requests three times: all requests of a burst start
together, as the first wave of ``omni bench`` does. Per burst it prints the time to first text
and first audio (median, max) and what was compiled meanwhile: dynamo frames and graphs
(``torch._dynamo.utils.counters``) and new files in Triton's kernel cache (a fresh
``TRITON_CACHE_DIR``). A first burst slower than the next two with compiles in it is a start-up
warm-up's job; equal bursts mean the cost is the burst itself. Under each burst, the median of
each stage mark (``profile_speech.Marks``), the runners' mean call times, and the garbage
collector's full collections: the heap is frozen after start-up, as ``omni serve`` does.
``TORCH_LOGS=recompiles`` names what a compile in a burst was for.

    python tests/gpu/first_burst.py [--model-path DIR] [--levels 1,4,16,32] [--dtype bfloat16]

A released shape with random weights: ``omni tiny-checkpoint [--family qwen3_omni_moe] --shape
released DIR``, then ``--model-path DIR --load-format dummy``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton-first-burst-"))

from profile_speech import Marks, speech_request  # tests/gpu, beside this script

from omni_runtime.contract.engine import AudioChunk, TextDelta
from omni_runtime.contract.options import EngineOptions
from omni_runtime.pipeline import build_engine
from omni_runtime.support.gc_pauses import collections, freeze_heap, longest_pause, watch_gc


def compiled() -> tuple[int, int, int]:
    """(dynamo frames compiled, dynamo graphs, Triton kernel cache entries) so far."""
    from torch._dynamo.utils import counters

    cache = Path(os.environ["TRITON_CACHE_DIR"])
    kernels = sum(1 for _ in cache.iterdir()) if cache.exists() else 0
    return int(counters["frames"]["ok"]), int(counters["stats"]["unique_graphs"]), kernels


async def one(engine, hook: Marks, rid: str, talker_tokens: int) -> tuple[float, float]:
    request = speech_request(rid, talker_tokens, text_tokens=32)
    start = hook.begin(rid)["_start"]
    text = audio = float("nan")
    async for event in engine.generate(request):
        now = time.perf_counter() - start
        if isinstance(event, TextDelta) and text != text:
            text = now
        elif isinstance(event, AudioChunk) and audio != audio:
            audio = now
    return text, audio


async def main(args: argparse.Namespace) -> None:
    model_path = args.model_path
    if model_path is None:
        from omni_runtime.models.qwen3_omni_moe.tiny import ensure_tiny_checkpoint

        model_path = str(ensure_tiny_checkpoint(progress=False))
    engine = build_engine(
        EngineOptions(
            model_path=model_path,
            load_format=args.load_format,
            device=args.device,
            dtype=args.dtype,
            pipeline="streaming-speech",
            max_batch_size=max(args.levels),
        )
    )
    began = time.perf_counter()
    await engine.start()
    print(f"engine started and warm in {time.perf_counter() - began:.1f} s; compiled so far {compiled()}")
    watch_gc()
    freeze_heap("first_burst")
    hook = Marks(engine)
    hook.take_calls()
    print("level  burst  first text p50/max s  first audio p50/max s  wall s  new (frames, graphs, triton)")
    for level in args.levels:
        for burst in range(1, args.bursts + 1):
            rids = [f"c{level}-b{burst}-{k}" for k in range(level)]
            before = compiled()
            t0 = time.perf_counter()
            results = await asyncio.gather(*(one(engine, hook, rid, args.talker_tokens) for rid in rids))
            wall = time.perf_counter() - t0
            after = compiled()
            texts = [r[0] for r in results]
            audios = [r[1] for r in results]
            new = tuple(a - b for a, b in zip(after, before, strict=True))
            print(
                f"{level:5d}  {burst:5d}  {statistics.median(texts):.3f} / {max(texts):.3f}"
                f"          {statistics.median(audios):.3f} / {max(audios):.3f}"
                f"           {wall:6.2f}  {new}",
                flush=True,
            )
            names = sorted(
                {n for r in rids for n in hook.by_id[r] if not n.startswith("_")},
                key=lambda n: statistics.median(hook.by_id[r].get(n, 0.0) for r in rids),
            )
            marks = ", ".join(
                f"{n} {statistics.median(hook.by_id[r][n] for r in rids if n in hook.by_id[r]):.3f}"
                for n in names
            )
            print(f"             marks p50: {marks}")
            print(
                f"             calls: {hook.take_calls()}; gen-2 collections {collections(2)}, "
                f"longest {longest_pause(2) * 1000:.0f} ms",
                flush=True,
            )
    await engine.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", default=None, help="default: the tiny Qwen3-Omni-MoE checkpoint")
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of the script itself")
    parser.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16, 32])
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--talker-tokens", type=int, default=24)
    asyncio.run(main(parser.parse_args()))
