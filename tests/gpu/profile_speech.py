"""Where a streaming speech reply spends its time on a GPU (run by hand on the device machine).

Drives the engine directly with Qwen2.5-Omni-7B-shaped dummy weights and prints, for one request
at a time, when the first text token, each audio chunk and the end arrive; then times the talker
and the vocoder on their own.

    python tests/gpu/profile_speech.py /tmp/qwen2.5-omni-7b-dummy
"""

from __future__ import annotations

import asyncio
import sys
import time

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


async def one(engine, rid: str, talker_tokens: int) -> None:
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

    def timed_submit(*args, **kwargs):
        marks.setdefault("talker admitted", time.perf_counter() - start)
        return submit(*args, **kwargs)

    async def timed_synthesize(item):
        marks.setdefault("first window asked", time.perf_counter() - start)
        pcm = await synthesize(item)
        marks.setdefault("first window done", time.perf_counter() - start)
        return pcm

    talker.submit, stages.synthesize = timed_submit, timed_synthesize
    first_text = None
    chunks = []
    async for event in engine.generate(request):
        now = time.perf_counter() - start
        if isinstance(event, TextDelta) and first_text is None:
            first_text = now
        elif isinstance(event, AudioChunk):
            chunks.append((round(now, 3), len(event.pcm)))
        elif isinstance(event, Finished):
            print(f"{rid}: first text {first_text:.3f}s, end {now:.3f}s, {event.usage}")
    talker.submit, stages.synthesize = submit, synthesize
    print(f"{rid}: " + ", ".join(f"{k} {v:.3f}s" for k, v in marks.items()))
    print(f"{rid}: audio chunks (arrival s, samples): {chunks[:6]} ... {len(chunks)} chunks")


async def main(path: str) -> None:
    engine = build_engine(
        EngineOptions(model_path=path, load_format="dummy", device="cuda", pipeline="streaming-speech")
    )
    await engine.start()
    await one(engine, "warm", 60)
    for i in range(2):
        await one(engine, f"r{i}", 400)
    vocoder = getattr(engine, "vocoder", None) or getattr(getattr(engine, "stages", None), "vocoder", None)
    print("vocoder object:", type(vocoder).__name__ if vocoder is not None else None)
    if vocoder is not None:
        voice = next(iter(vocoder.speakers))
        for n in (15, 55):
            codes = list(range(100, 100 + n))
            for _ in range(2):
                vocoder.synthesize(codes, start=0, end=n, ctx_start=0, ctx_end=n, voice=voice, seed=0)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(5):
                vocoder.synthesize(codes, start=0, end=n, ctx_start=0, ctx_end=n, voice=voice, seed=0)
            torch.cuda.synchronize()
            print(f"vocoder window of {n} codes: {(time.perf_counter() - t) / 5 * 1e3:.1f} ms")
    await engine.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
