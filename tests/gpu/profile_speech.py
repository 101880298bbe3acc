"""Where a streaming speech reply spends its time on a GPU (run by hand on the device machine).

Drives the engine directly with dummy weights at a released shape (the family is the checkpoint's
``model_type``) and prints, for one request at a time, when the first text token, the talker's
admission, the first vocoder window (asked, done) and each audio chunk arrive; then the same
with other first-window sizes (``--first-chunk 2,3``: the adapter's ``codec_windows`` changed
between requests, so one load serves every variant); then times the vocoder alone per window
size and batch.

    python tests/gpu/profile_speech.py /tmp/qwen2.5-omni-7b-dummy
    python tests/gpu/profile_speech.py /tmp/qwen3-omni-30b-a3b-dummy --talker-tokens 125 --first-chunk 2,3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import torch

from omni_runtime.contract.engine import (
    AudioChunk,
    ChatTurn,
    Finished,
    GenerationRequest,
    SamplingParams,
    TextDelta,
)
from omni_runtime.contract.options import EngineOptions
from omni_runtime.pipeline import build_engine


async def one(engine: Any, rid: str, talker_tokens: int, *, quiet: bool = False) -> dict[str, float]:
    request = GenerationRequest(
        request_id=rid,
        turns=(ChatTurn(role="user", text="Tell me a story about a robot."),),
        sampling=SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True),
        want_audio=True,
        stage_params={"talker": {"max_tokens": talker_tokens}},
    )
    start = time.perf_counter()
    marks: dict[str, float] = {}
    stages = engine.stages
    talker = stages.talker
    submit, synthesize = talker.submit, stages.synthesize

    def timed_submit(*args: Any, **kwargs: Any) -> Any:
        marks.setdefault("talker admitted", time.perf_counter() - start)
        return submit(*args, **kwargs)

    async def timed_synthesize(item: Any) -> Any:
        marks.setdefault("first window asked", time.perf_counter() - start)
        pcm = await synthesize(item)
        marks.setdefault("first window done", time.perf_counter() - start)
        return pcm

    talker.submit, stages.synthesize = timed_submit, timed_synthesize
    chunks: list[tuple[float, int]] = []
    try:
        async for event in engine.generate(request):
            now = time.perf_counter() - start
            if isinstance(event, TextDelta):
                marks.setdefault("first text", now)
            elif isinstance(event, AudioChunk):
                marks.setdefault("first audio", now)
                chunks.append((round(now, 3), len(event.pcm)))
            elif isinstance(event, Finished):
                marks["end"] = now
    finally:
        talker.submit, stages.synthesize = submit, synthesize
    if not quiet:
        print(f"{rid}: " + ", ".join(f"{k} {v:.3f}s" for k, v in sorted(marks.items(), key=lambda kv: kv[1])))
        print(f"{rid}: audio chunks (arrival s, samples): {chunks[:6]} ... {len(chunks)} chunks")
    return marks


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def vocoder_of(engine: Any) -> Any:
    local = getattr(engine.stages, "local", engine.stages)
    return getattr(local, "vocoder", None)


def time_vocoder(vocoder: Any, windows: dict[str, tuple[int, int, int, int]], *, groups: int) -> None:
    """Milliseconds per ``synthesize_many`` call, per window shape and batch (Qwen3's Code2Wav)."""
    for name, (ctx_start, start, end, ctx_end) in windows.items():
        for batch in (1, 8):
            frames = [[(7 * i + g) % 1000 for g in range(groups)] for i in range(ctx_end)]
            window = {"start": start, "end": end, "ctx_start": ctx_start, "ctx_end": ctx_end}
            items = [{"codes": frames, "window": window} for _ in range(batch)]
            for _ in range(2):
                vocoder.synthesize_many(items)
            sync()
            t = time.perf_counter()
            for _ in range(5):
                vocoder.synthesize_many(items)
            sync()
            ms = (time.perf_counter() - t) / 5 * 1e3
            print(f"vocoder {name} ({ctx_end - ctx_start} frames), batch {batch}: {ms:.1f} ms")


async def main(args: argparse.Namespace) -> None:
    engine = build_engine(
        EngineOptions(
            model_path=args.path,
            load_format=args.load_format,
            device=args.device,
            pipeline="streaming-speech",
        )
    )
    await engine.start()
    windows = dict(engine.adapter.codec_windows)
    print("codec windows:", windows)
    await one(engine, "warm", 60, quiet=True)
    variants = [None, *args.first_chunk]
    summary: dict[str, list[dict[str, float]]] = {}
    for first in variants:
        label = "default" if first is None else f"first_chunk={first}"
        engine.adapter.codec_windows = windows if first is None else {**windows, "first_chunk": first}
        await one(engine, f"warm-{label}", 30, quiet=True)
        summary[label] = [
            await one(engine, f"{label}-r{i}", args.talker_tokens) for i in range(args.requests)
        ]
    engine.adapter.codec_windows = windows
    print("median per variant (s):")
    for label, runs in summary.items():
        keys = [
            k
            for k in (
                "first text",
                "talker admitted",
                "first window asked",
                "first window done",
                "first audio",
                "end",
            )
            if all(k in r for r in runs)
        ]
        print(f"  {label}: " + ", ".join(f"{k} {statistics.median(r[k] for r in runs):.3f}" for k in keys))
    vocoder = vocoder_of(engine)
    print("vocoder object:", type(vocoder).__name__ if vocoder is not None else None)
    if vocoder is not None and hasattr(vocoder, "groups"):  # Qwen3's Code2Wav: frames of codes
        first = int(windows.get("first_chunk", 5))
        left, right, chunk = (
            int(windows["left_context"]),
            int(windows["right_context"]),
            int(windows["chunk"]),
        )
        shapes = {
            "first window": (0, 0, first, first + right),
            "2-frame first window": (0, 0, 2, 2 + right),
            "steady window": (0, left, left + chunk, left + chunk + right),
        }
        time_vocoder(vocoder, shapes, groups=vocoder.groups)
    await engine.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--load-format", default="dummy", help="auto for a checkpoint with weights (a CPU smoke run)"
    )
    parser.add_argument("--talker-tokens", type=int, default=400)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--first-chunk", type=lambda s: [int(x) for x in s.split(",") if x], default=[])
    asyncio.run(main(parser.parse_args()))
