"""What queuing each thinker decode step ahead (``OMNI_THINKER_AHEAD``) gives a served text stream:
one engine in-process (the released Qwen3-Omni-30B-A3B thinker with random weights by default),
the text pipeline, the same greedy requests with the scheduler's queue-ahead off and on in turn
(off, on, off, on: the same engine, so the same kernels and graphs). Per run and concurrency:
the mean time between a stream's tokens after its first (what a reader of the stream sees), the
slowest stream's, and the steps queued ahead. Run by hand on the device machine:

    omni tiny-checkpoint --family qwen3_omni_moe --shape released /tmp/q3
    python tests/gpu/thinker_ahead.py --model-path /tmp/q3 --load-format dummy --levels 1,4 --tokens 256
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from omni_runtime.contract.engine import ChatTurn, GenerationRequest, SamplingParams, TextDelta
from omni_runtime.contract.options import EngineOptions
from omni_runtime.pipeline import build_engine


async def stream(engine, rid: str, tokens: int) -> list[float]:
    """Seconds at which each text delta arrived."""
    request = GenerationRequest(
        request_id=rid,
        turns=(ChatTurn(role="user", text=f"Request {rid}: tell me a long story."),),
        sampling=SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True),
    )
    arrived = []
    async for event in engine.generate(request):
        if isinstance(event, TextDelta):
            arrived.extend([time.perf_counter()] * max(1, len(event.token_ids)))
    return arrived


async def main(args: argparse.Namespace) -> None:
    engine = build_engine(
        EngineOptions(
            model_path=args.model_path,
            load_format=args.load_format,
            device=args.device,
            pipeline="text",
            max_batch_size=max(args.levels),
            max_model_len=args.tokens + 512,
        )
    )
    began = time.perf_counter()
    await engine.start()
    print(f"engine started in {time.perf_counter() - began:.1f} s", flush=True)
    thinker = engine.stages.local.thinker
    await stream(engine, "warm", 32)
    print("run  ahead  streams  ms between tokens: mean / slowest stream  steps ahead")
    for run, ahead in enumerate(args.order.split(",")):
        thinker.ahead = ahead == "on"
        for level in args.levels:
            steps = thinker.steps_ahead
            arrivals = await asyncio.gather(
                *(stream(engine, f"{run}-{level}-{k}", args.tokens) for k in range(level))
            )
            gaps = [(a[-1] - a[0]) / (len(a) - 1) * 1000 for a in arrivals]
            print(
                f"{run:3d}  {ahead:5s}  {level:7d}  {statistics.mean(gaps):8.3f} / {max(gaps):8.3f}"
                f"  {thinker.steps_ahead - steps:11d}",
                flush=True,
            )
    await engine.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--order", default="off,on,off,on")
    asyncio.run(main(parser.parse_args()))
