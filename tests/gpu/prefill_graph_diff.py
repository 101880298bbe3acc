"""Where replies with prefill graphs part from replies without, on a tiny checkpoint (float32).

Run by hand on the device machine. Starts the engine in-process (streaming speech), then runs the
same seeded replies (one at a time, then together) under each prefill mode of both stacks:
unpadded, padded eagerly, padded as CUDA graphs, and graphs on one stack only. For every reply it
prints whether the text ids, the talker's codes and the audio equal the unpadded run's, and where
the codes first part. With ``--shadow`` every padded prefill is also run unpadded first, on the
same slots (the padded call writes the cache last), and the largest difference of its outputs is
printed per call: a wrong prefill shows at the call that makes it.

    python tests/gpu/prefill_graph_diff.py [--family qwen3_omni_moe] [--temperature 1.0] [--shadow]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import numpy as np
from prefill_shapes import shadow_padded_prefills  # tests/gpu, beside this script

from omni_runtime.contract.engine import AudioChunk, ChatTurn, GenerationRequest, SamplingParams, TextDelta
from omni_runtime.contract.options import EngineOptions
from omni_runtime.pipeline import build_engine

PROMPTS = ["Tell me a short story.", "Hello, how are you today?", "What is the weather like?"]
MODES = ("off", "padded", "graphs", "thinker", "talker")


def request(prompt: str, temperature: float) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"diff-{time.monotonic_ns()}",
        turns=(ChatTurn(role="user", text=prompt),),
        sampling=SamplingParams(max_tokens=16, temperature=temperature, seed=5, ignore_eos=True),
        want_audio=True,
        stage_params={"talker": {"max_tokens": 60}},
    )


class Recorder:
    """Each request's talker codes, through the talker worker's ``_accept``."""

    def __init__(self, engine: Any) -> None:
        talker = engine.stages.local.talker
        self.codes: dict[str, list[Any]] = {}
        accept = talker._accept

        def recorded(job: Any, code: Any) -> Any:
            self.codes.setdefault(job.request_id, []).append(
                tuple(code) if isinstance(code, (tuple, list)) else code
            )
            return accept(job, code)

        talker._accept = recorded


async def main(args: argparse.Namespace) -> None:
    if args.family == "qwen3_omni_moe":
        from omni_runtime.models.qwen3_omni_moe.tiny import ensure_tiny_checkpoint
    else:
        from omni_runtime.models.qwen2_5_omni.tiny import ensure_tiny_checkpoint
    engine = build_engine(
        EngineOptions(
            model_path=str(ensure_tiny_checkpoint(progress=False)),
            device=args.device,
            dtype=args.dtype,
            pipeline="streaming-speech",
            max_batch_size=8,
            max_model_len=1024,
        )
    )
    await engine.start()
    recorder = Recorder(engine)
    local = engine.stages.local
    log: list[dict[str, Any]] = []
    if args.shadow:
        for name in ("thinker", "talker"):
            shadow_padded_prefills(getattr(local, name).runner.decoder, name, log)

    async def one(prompt: str) -> tuple[list[int], list[Any], np.ndarray]:
        req = request(prompt, args.temperature)
        events = [e async for e in engine.generate(req)]
        ids = [t for e in events if isinstance(e, TextDelta) for t in e.token_ids]
        pcm = [e.pcm for e in events if isinstance(e, AudioChunk)]
        return ids, recorder.codes.get(req.request_id, []), np.concatenate(pcm) if pcm else np.zeros(0)

    async def replies() -> list[tuple[list[int], list[Any], np.ndarray]]:
        alone = [await one(p) for p in PROMPTS]
        return alone + list(await asyncio.gather(*(one(p) for p in PROMPTS)))

    results: dict[str, Any] = {}
    for mode in MODES if args.device == "cuda" else MODES[:2]:  # graphs on CUDA only
        for name in ("thinker", "talker"):
            stage = getattr(local, name)
            decoder = stage.runner.decoder
            graphs = mode in ("graphs", name)
            if graphs and not decoder._prefill_graphs:
                decoder.prefill_graphs = decoder.prefill_padded = True
                count = await stage.thread.run(decoder.capture_prefills)
                print(f"{name}: {count} prefill graphs captured", flush=True)
            decoder.prefill_graphs = graphs
            decoder.prefill_padded = graphs or mode == "padded"
        log.clear()
        results[mode] = await replies()
        print(f"mode {mode}:", flush=True)
        for entry in log:
            print(
                "   ",
                ", ".join(f"{k} {v:.2g}" if isinstance(v, float) else f"{k} {v}" for k, v in entry.items()),
            )
        for k, ((ids, codes, pcm), (want_ids, want_codes, want_pcm)) in enumerate(
            zip(results[mode], results["off"], strict=True)
        ):
            part = next((i for i, (a, b) in enumerate(zip(codes, want_codes, strict=False)) if a != b), None)
            if part is None and len(codes) != len(want_codes):
                part = min(len(codes), len(want_codes))
            diff = (
                float(np.abs(pcm - want_pcm).max() / (np.abs(want_pcm).max() or 1.0))
                if pcm.shape == want_pcm.shape
                else float("nan")
            )
            print(
                f"  reply {k} ({'alone' if k < len(PROMPTS) else 'together'}): text "
                f"{'same' if ids == want_ids else 'DIFFERS'}, codes {len(codes)} vs {len(want_codes)}"
                + (
                    ""
                    if part is None
                    else f", first differ at frame {part}: {codes[part : part + 1]} vs {want_codes[part : part + 1]}"
                )
                + f", audio {pcm.shape[0]} vs {want_pcm.shape[0]} samples, max diff {diff:.2g}",
                flush=True,
            )
    await engine.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", default="qwen2_5_omni")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--shadow", action="store_true", help="also run each padded prefill unpadded")
    asyncio.run(main(parser.parse_args()))
