"""`omni bench`: load-test a worker or router, print a table, write JSON and PNG plots.

    omni bench --url http://127.0.0.1:8000 --concurrency 1,4,16 --requests 32 --mode speech --stream \
        --max-tokens 128 --out bench-out/                 # closed loop: N in flight
    omni bench --url http://127.0.0.1:8000 --rate 1,2,4 --duration 60 --mode speech --stream \
        --out bench-out/                                  # open loop: Poisson arrivals per second

Speech levels report what a listener hears (TTFA percentiles, underrun seconds per stream, RTF,
streams that stayed real time, audio seconds per second) and plot them in speech.png. With
``--out``, requests.jsonl has one row per request: when it was sent, its TTFT, TTFA and latency,
and its listener's stall, closest call and audio timeline (which requests make a level's tail, and
which window came late).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import httpx

from omni_runtime.bench.cancel_tail import metrics_url_of
from omni_runtime.bench.load import (
    LoadSpec,
    discover_model,
    one_request,
    poisson_arrivals,
    run_level,
    run_open_loop,
)
from omni_runtime.bench.report import format_table, load_baselines, plot, plot_speech, write_json
from omni_runtime.bench.stats import LevelSummary, request_rows, summarize
from omni_runtime.bench.worker_metrics import fetch_metrics, first_audio_report, worker_report
from omni_runtime.support.cli_types import arrival_rates, positive_float, positive_int


def _levels(text: str) -> list[int]:
    try:
        levels = [int(p) for p in text.split(",") if p.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of integers, e.g. 1,4,16") from exc
    if not levels or any(c < 1 for c in levels):
        raise argparse.ArgumentTypeError(f"{text!r}: concurrency levels must be integers >= 1")
    return levels


def _json_object(text: str) -> dict[str, object]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    stages = value.get("stage_params", {})
    if not isinstance(stages, dict) or not all(isinstance(v, dict) for v in stages.values()):
        raise argparse.ArgumentTypeError(
            'stage_params must map each stage to an object, e.g. {"talker": {"max_tokens": 400}}'
        )
    return value


def with_talker_tokens(extra_body: dict[str, object] | None, tokens: int | None) -> dict[str, object] | None:
    """--extra-body with --talker-tokens as its talker budget (which request_body speaks whole);
    ValueError when --extra-body sets that budget itself."""
    if tokens is None:
        return extra_body
    body = dict(extra_body or {})
    stages = {k: dict(v) for k, v in cast(dict[str, dict[str, object]], body.get("stage_params", {})).items()}
    if "max_tokens" in stages.get("talker", {}):
        raise ValueError(
            "--talker-tokens and --extra-body's stage_params.talker.max_tokens both set the talker budget; give one"
        )
    stages["talker"] = {**stages.get("talker", {}), "max_tokens": tokens}
    body["stage_params"] = stages
    return body


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omni bench", description="Load-test an omni worker or router.")
    p.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", help="model name (default: the first of GET /v1/models)")
    p.add_argument("--concurrency", type=_levels, default=[1, 4, 16], help="comma list (default 1,4,16)")
    p.add_argument(
        "--requests", type=positive_int, default=None, help="requests per level (default 4 x concurrency)"
    )
    p.add_argument(
        "--waves",
        type=positive_int,
        default=None,
        help="requests per level as waves x concurrency (e.g. 1: each level is one wave of concurrent "
        "requests); --requests wins when both are given",
    )
    p.add_argument(
        "--rate",
        type=arrival_rates,
        default=None,
        help="open loop instead: comma list of Poisson arrival rates (requests/s), one level each",
    )
    p.add_argument(
        "--duration", type=positive_float, default=60.0, help="open loop: seconds of arrivals per level"
    )
    p.add_argument("--seed", type=int, default=0, help="open loop: seed of the arrival times")
    p.add_argument("--mode", choices=["text", "speech"], default="text")
    p.add_argument("--stream", action="store_true", help="SSE: measures time to first token / first audio")
    p.add_argument("--max-tokens", type=positive_int, default=128, help="fixed output length (ignore_eos)")
    p.add_argument(
        "--talker-tokens",
        type=positive_int,
        default=None,
        help="speech: codec tokens a reply speaks, exactly (stage_params.talker max_tokens + ignore_eos; "
        "Qwen2.5-Omni makes 50 a second of audio, Qwen3-Omni 12.5); default: the talker ends where it ends",
    )
    p.add_argument("--warmup", type=int, default=1, help="unmeasured requests before the first level")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    p.add_argument("--out", type=Path, help="directory for bench.json and bench.png")
    p.add_argument(
        "--baseline-json",
        type=Path,
        action="append",
        default=[],
        help="extra rows (e.g. HF generate) to show next to ours; repeatable",
    )
    p.add_argument("--label", default="omni", help="label of this run's rows (default: omni)")
    p.add_argument(
        "--extra-body",
        type=_json_object,
        default=None,
        help='JSON merged into every request (stage_params per stage), e.g. \'{"stage_params": {"talker": {"max_tokens": 200}}}\'',
    )
    return p


def _progress(level: str, total: int) -> Callable[[int], None]:
    def show(done: int) -> None:
        end = "\n" if done == total else ""
        print(f"\r  {level}: {done}/{total} requests", end=end, file=sys.stderr, flush=True)

    return show


async def _run(args: argparse.Namespace) -> int:
    try:
        model = args.model or await discover_model(args.url)
    except httpx.TransportError as exc:  # nothing answers there: --model would not help
        print(
            f"omni bench: cannot reach {args.url} ({exc or type(exc).__name__}); start the worker or router "
            "first (omni up, omni serve) or fix --url",
            file=sys.stderr,
        )
        return 1
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        print(
            f"omni bench: cannot read the model list from {args.url}/v1/models: {exc}; pass --model",
            file=sys.stderr,
        )
        return 1
    spec = LoadSpec(
        url=args.url,
        model=model,
        mode=args.mode,
        stream=args.stream,
        max_tokens=args.max_tokens,
        timeout_s=args.timeout,
        extra_body=args.extra_body,
    )
    shape = f"rates={args.rate}/s for {args.duration:g}s" if args.rate else f"levels={args.concurrency}"
    print(
        f"omni bench: {args.url} model={model} mode={args.mode} stream={args.stream} "
        f"max_tokens={args.max_tokens}"
        + (f" talker_tokens={args.talker_tokens}" if args.talker_tokens is not None else "")
        + f" {shape}",
        file=sys.stderr,
    )
    if args.warmup > 0:
        async with httpx.AsyncClient(base_url=args.url, timeout=args.timeout) as client:
            for _ in range(args.warmup):
                sample = await one_request(client, replace(spec, max_tokens=min(spec.max_tokens, 8)))
                if not sample.ok:
                    print(f"omni bench: warm-up request failed: {sample.error}", file=sys.stderr)
                    return 1
    metrics = metrics_url_of(args.url)  # the worker's own account of each level (worker_metrics)
    levels, rows = await _levels_run(spec, args, metrics)
    baselines = [row for path in args.baseline_json for row in load_baselines(path)]
    print(format_table([*levels, *baselines]))
    if args.mode == "speech" and args.stream:
        print(first_audio_report(levels, url=metrics))
    for row in levels:
        if row.failed:
            print(
                f"load {row.load}: {row.failed} failed ({row.refused} refused with 429 at the worker's "
                f"capacity), first error: {row.first_error}",
                file=sys.stderr,
            )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {
            "url": args.url,
            "model": model,
            "mode": args.mode,
            "stream": args.stream,
            "max_tokens": args.max_tokens,
            "requests": args.requests,
            "concurrency": None if args.rate else args.concurrency,
            "rate_per_s": args.rate,
            "duration_s": args.duration if args.rate else None,
            "seed": args.seed if args.rate else None,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        write_json(args.out / "bench.json", meta=meta, levels=levels, baselines=baselines)
        with (args.out / "requests.jsonl").open("w") as out:  # each request, for a tail's story
            out.writelines(json.dumps(row) + "\n" for row in rows)
        title = f"{model}: {args.mode}{' (stream)' if args.stream else ''}, {args.max_tokens} tokens"
        plot(args.out / "bench.png", rows=[*levels, *baselines], title=title)
        written = [args.out / "bench.json", args.out / "requests.jsonl", args.out / "bench.png"]
        if any(row.audio_streams for row in [*levels, *baselines]):
            plot_speech(args.out / "speech.png", rows=[*levels, *baselines], title=title)
            written.append(args.out / "speech.png")
        print(f"wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    # Refusals at capacity are the worker doing its job (admission), not a failed run.
    return 0 if all(row.failed == row.refused for row in levels) else 1


async def _levels_run(
    spec: LoadSpec, args: argparse.Namespace, metrics: str
) -> tuple[list[LevelSummary], list[dict[str, Any]]]:
    """Closed loop at each --concurrency level, or open loop at each --rate; the summaries (with
    the worker's ``metrics`` URL's account of each) and one row per request."""
    levels: list[LevelSummary] = []
    rows: list[dict[str, Any]] = []
    if args.rate:
        for rate in args.rate:
            arrivals = poisson_arrivals(rate, args.duration, seed=args.seed)
            before = await fetch_metrics(metrics)
            samples, wall, peak = await run_open_loop(
                spec, arrivals=arrivals, on_done=_progress(f"rate {rate:g}/s", len(arrivals))
            )
            summary = summarize(samples, concurrency=peak, wall_s=wall, label=args.label, rate_per_s=rate)
            levels.append(
                replace(summary, worker=worker_report(before, await fetch_metrics(metrics), wall) or None)
            )
            rows.extend(request_rows(samples, level=f"{rate:g}/s"))
        return levels, rows
    for concurrency in args.concurrency:
        total = args.requests or (args.waves or 4) * concurrency
        before = await fetch_metrics(metrics)
        samples, wall = await run_level(
            spec,
            concurrency=concurrency,
            requests=total,
            on_done=_progress(f"concurrency {concurrency}", total),
        )
        summary = summarize(samples, concurrency=concurrency, wall_s=wall, label=args.label)
        levels.append(
            replace(summary, worker=worker_report(before, await fetch_metrics(metrics), wall) or None)
        )
        rows.extend(request_rows(samples, level=f"c={concurrency}"))
    return levels, rows


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.talker_tokens is not None and args.mode != "speech":
        print("omni bench: --talker-tokens is the speech replies' length; add --mode speech", file=sys.stderr)
        return 2
    try:
        args.extra_body = with_talker_tokens(args.extra_body, args.talker_tokens)
    except ValueError as exc:
        print(f"omni bench: {exc}", file=sys.stderr)
        return 2
    for path in args.baseline_json:
        try:
            load_baselines(path)  # fail on a bad baseline file before minutes of load
        except (OSError, ValueError) as exc:
            print(f"omni bench: --baseline-json {path}: {exc}", file=sys.stderr)
            return 2
    return asyncio.run(_run(args))
