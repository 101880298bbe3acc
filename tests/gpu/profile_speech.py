"""Where a streaming speech reply spends its time on a GPU (run by hand on the device machine).

Drives the engine directly with dummy weights at a released shape (the family is the checkpoint's
``model_type``) and prints, for one request at a time, when the first text token, the talker's
admission, the first vocoder window (asked, done) and each audio chunk arrive; then the same
with other first-window sizes (``--first-chunk 2,3``: the adapter's ``codec_windows`` changed
between requests, so one load serves every variant); then times the vocoder alone per window
size and batch.

    python tests/gpu/profile_speech.py /tmp/qwen2.5-omni-7b-dummy
    python tests/gpu/profile_speech.py /tmp/qwen3-omni-30b-a3b-dummy --talker-tokens 125 --first-chunk 2,3
    python tests/gpu/profile_speech.py /tmp/qwen3-omni-30b-a3b-dummy --talker-tokens 125 --concurrency 32

``--concurrency`` runs closed-loop levels in-process and reports each mark's p50/p95: where the
time to first audio goes under load (preprocessing, the thinker's first token, the talker's first
frame, the first vocoder window), and what a listener hears (stall per stream, streams that stayed
real time, audio seconds per second: ``omni_runtime.bench.playback``, as ``omni bench`` plays them).
``--window-variants '[{"catch_up": false}]'`` runs every level again with those ``codec_windows``
overrides, one model load for a side-by-side comparison (two keys switch the engine instead:
``serial_talker_admission`` replays the old talker admission, ``stock_bigvgan`` transformers' own
BigVGAN activations instead of the Triton kernel, ``stock_dit`` transformers' own DiT block instead of
the vocoder's, ``holds_spare_text`` false lets a later window pause the thinker while another reply's
talker takes its text, ``thinker_hold_below_s`` which windows pause the
thinker, ``vocoder_graphs`` false every vocoder window eagerly, ``windows_ahead`` how many of a
reply's windows may be at the vocoder at once, ``vocoder_far`` ``[seconds, windows]`` as
``OMNI_VOCODER_FAR`` sets it, far windows out of nearer ones' calls (``[seconds, windows, "near"]``:
their calls bounded only while a stream is near, ``FarWindows.near_only``), ``vocoder_buckets`` the batch
sizes the vocoder pads to, as ``OMNI_VOCODER_BUCKETS`` sets them, ``first_linger_codes`` how near
another reply's first window must be for a ready one to wait for it, 0 never). ``--rates 2``
adds open-loop levels (Poisson arrivals a second for ``--duration`` seconds, ``omni bench
--rate``'s arrivals for the same ``--seed``): streams out of phase, where the vocoder's calls by
window size (printed with the runner calls) show how far they are split:

    python tests/gpu/profile_speech.py /tmp/qwen2.5-omni-7b-dummy --concurrency 1,16,32 --waves 1 \
        --window-variants '[{"catch_up": false}]'
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from omni_runtime.bench.load import poisson_arrivals
from omni_runtime.bench.playback import Chunk, play
from omni_runtime.bench.report import format_table, plot_speech, write_json
from omni_runtime.bench.stats import LevelSummary, RequestSample, summarize
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
from omni_runtime.pipeline.deadlines import FarWindows
from omni_runtime.support.cli_types import arrival_rates
from omni_runtime.support.gc_pauses import collections, freeze_heap, longest_pause, watch_gc


class Marks:
    """Per-request timestamps (seconds after the request started) from hooks on the engine's
    stages, installed once so concurrent requests are told apart: by request id where the stage
    sees one, else by the request's task context (the vocoder call runs in it)."""

    current: contextvars.ContextVar[dict[str, float]] = contextvars.ContextVar("marks")

    def __init__(self, engine: Any) -> None:
        self.by_id: dict[str, dict[str, float]] = {}
        self.start: dict[str, float] = {}
        stages = engine.stages
        talker = stages.talker
        preprocess, submit, accept, synthesize = (
            stages.preprocess,
            talker.submit,
            talker._accept,
            stages.synthesize,
        )

        def mark(rid: str, name: str) -> None:
            if rid in self.by_id:
                self.by_id[rid].setdefault(name, time.perf_counter() - self.start[rid])

        async def timed_preprocess(request: Any) -> Any:
            out = await preprocess(request)
            mark(request.request_id, "preprocessed")
            return out

        def timed_submit(job: Any) -> Any:
            mark(job.request_id, "talker submitted")
            return submit(job)

        def timed_accept(job: Any, code: Any) -> Any:
            mark(job.request_id, "first frame")
            return accept(job, code)

        async def timed_synthesize(item: Any) -> Any:
            marks = self.current.get(None)
            t0 = time.perf_counter()
            pcm = await synthesize(item)
            if marks is not None and "first window asked" not in marks:
                base = marks["_start"]
                marks["first window asked"] = t0 - base
                marks["first window done"] = time.perf_counter() - base
            return pcm

        aggregate = stages.aggregate

        async def timed_aggregate(prompt: Any, **kwargs: Any) -> Any:
            out = await aggregate(prompt, **kwargs)
            marks = self.current.get(None)
            if marks is not None:
                marks.setdefault("aggregated", time.perf_counter() - marks["_start"])
            return out

        # How each reply's talker ended, and after how many codes (a random-weight talker can draw
        # its end code early; a reply with no audio says which way it went).
        self.talker_ends: dict[str, tuple[str, int]] = {}
        end = talker._end

        def recorded_end(job: Any, reason: Any, **kwargs: Any) -> Any:
            self.talker_ends.setdefault(job.request_id, (str(reason), int(job.codes)))
            return end(job, reason, **kwargs)

        talker._end = recorded_end
        stages.preprocess, talker.submit, talker._accept = timed_preprocess, timed_submit, timed_accept
        stages.synthesize, stages.aggregate = timed_synthesize, timed_aggregate
        # Wall time of the runners' calls on their threads (each ends in a host read of its tokens).
        self.calls: dict[str, list[float]] = {}
        local = getattr(stages, "local", stages)
        for name, runner in (("thinker", local.thinker.runner), ("talker", local.talker.runner)):
            for method in ("admit", "step"):
                setattr(runner, method, self._timed(f"{name}.{method}", getattr(runner, method)))
        # The vocoder's batched calls: how long each took and how many windows it carried.
        self.batches: list[int] = []
        self.sizes: list[tuple[int, ...]] = []  # the window context sizes of each vocoder call
        vocoder = getattr(local, "vocoder", None)
        if vocoder is not None:
            timed = self._timed("vocoder.call", vocoder.synthesize_many)

            def counted(items: list[Any]) -> Any:
                self.batches.append(len(items))
                sizes = {item["window"]["ctx_end"] - item["window"]["ctx_start"] for item in items}
                self.sizes.append(tuple(sorted(sizes)))
                return timed(items)

            vocoder.synthesize_many = counted

    def _timed(self, key: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.calls.setdefault(key, []).append(time.perf_counter() - t0)

        return call

    def take_calls(self) -> str:
        """Mean and count of each runner call since the last take, in ms."""
        out = ", ".join(
            f"{k} {sum(v) / len(v) * 1e3:.1f} ms x{len(v)}" for k, v in sorted(self.calls.items()) if v
        )
        if self.batches:
            out += f"; vocoder windows per call mean {sum(self.batches) / len(self.batches):.1f}, max {max(self.batches)}"
            out += "; vocoder calls by window size " + calls_by_size(self.sizes, self.batches)
        self.calls, self.batches, self.sizes = {}, [], []
        return out

    def begin(self, rid: str) -> dict[str, float]:
        self.start[rid] = time.perf_counter()
        marks = self.by_id[rid] = {"_start": self.start[rid]}
        self.current.set(marks)
        return marks


def speech_request(rid: str, talker_tokens: int, *, text_tokens: int = 64) -> GenerationRequest:
    """The profiled reply: a fixed prompt, greedy text of ``text_tokens``, ``talker_tokens`` codes."""
    return GenerationRequest(
        request_id=rid,
        turns=(ChatTurn(role="user", text="Tell me a story about a robot."),),
        sampling=SamplingParams(max_tokens=text_tokens, temperature=0.0, ignore_eos=True),
        want_audio=True,
        stage_params={"talker": {"max_tokens": talker_tokens, "ignore_eos": True}},  # exactly that long
    )


async def one(
    engine: Any, marks_hook: Marks, rid: str, talker_tokens: int, *, quiet: bool = False
) -> dict[str, float]:
    request = speech_request(rid, talker_tokens)
    marks = marks_hook.begin(rid)
    marks["_rid"] = rid  # type: ignore[assignment]
    start = marks["_start"]
    chunks: list[tuple[float, int]] = []
    timeline: list[Chunk] = []
    async for event in engine.generate(request):
        now = time.perf_counter() - start
        if isinstance(event, TextDelta):
            marks.setdefault("first text", now)
            marks["last text"] = now
        elif isinstance(event, AudioChunk):
            marks.setdefault("first audio", now)
            chunks.append((round(now, 3), len(event.pcm)))
            timeline.append(Chunk(arrival_s=now, duration_s=len(event.pcm) / event.sample_rate))
        elif isinstance(event, Finished):
            marks["end"] = now
            if event.reason == "error" or not timeline:
                print(
                    f"{rid}: ended {event.reason} ({event.error}) with {len(timeline)} audio chunks; talker "
                    f"ended (reason, codes): {marks_hook.talker_ends.get(rid)}",
                    flush=True,
                )
    marks["_began"] = marks.pop("_start")  # perf_counter at the start (gpu_timeline's clock)
    ended = marks_hook.talker_ends.get(rid)
    if ended is not None:  # how the talker ended: an early end code cuts the reply's audio short
        marks["_talker_end"], marks["_talker_codes"] = ended  # type: ignore[assignment]
    TIMELINES[rid] = tuple(timeline)
    heard = play(timeline)
    if heard is not None:  # what a listener hears (not a mark: reported apart)
        marks["_stall"], marks["_audio"], marks["_windows"] = heard.stall_s, heard.audio_s, len(timeline)
    if not quiet:
        shown = sorted((kv for kv in marks.items() if not kv[0].startswith("_")), key=lambda kv: kv[1])
        print(f"{rid}: " + ", ".join(f"{k} {v:.3f}s" for k, v in shown))
        print(f"{rid}: audio chunks (arrival s, samples): {chunks[:6]} ... {len(chunks)} chunks")
    return marks


TIMELINES: dict[str, tuple[Chunk, ...]] = {}  # each request's audio timeline, by request id


def calls_by_size(sizes: list[tuple[int, ...]], batches: list[int]) -> str:
    """``27: 40 calls, 2.1 windows`` for each window context size (or mix of sizes) the vocoder's
    calls carried: how far the calls are split by size (the vocoder batches one size per call)."""
    by: dict[tuple[int, ...], list[int]] = {}
    for key, count in zip(sizes, batches, strict=True):
        by.setdefault(key, []).append(count)
    return "; ".join(
        f"{'+'.join(map(str, key))}: {len(v)} calls, {sum(v) / len(v):.1f} windows"
        for key, v in sorted(by.items())
    )


async def open_loop(
    engine: Any, hook: Marks, args: argparse.Namespace, rate: float
) -> list[dict[str, float]]:
    """Replies arriving as a Poisson process at ``rate`` a second for ``--duration`` seconds (the
    arrivals ``omni bench --rate`` draws for the same seed), each started at its arrival."""
    began = time.perf_counter()

    async def arrive(k: int, at: float) -> dict[str, float]:
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - began)))
        return await one(engine, hook, f"r{rate:g}-i{k}", args.talker_tokens, quiet=True)

    arrivals = poisson_arrivals(rate, args.duration, seed=args.seed)
    return list(await asyncio.gather(*(arrive(k, at) for k, at in enumerate(arrivals))))


def level_summary(label: str, concurrency: int, runs: list[dict[str, float]], wall_s: float) -> LevelSummary:
    """One level as ``omni bench`` summarises it (bench.stats), from the in-process runs."""
    samples = [
        RequestSample(
            ok=True,
            latency_s=r["end"],
            ttft_s=r.get("first text"),
            ttfa_s=r.get("first audio"),
            output_tokens=64,
            audio=TIMELINES[r["_rid"]],
        )
        for r in runs
    ]
    return summarize(samples, concurrency=concurrency, wall_s=wall_s, label=label)


def peak_in_flight(runs: list[dict[str, float]]) -> int:
    """The most replies in flight at once (perf_counter starts and ends)."""
    events = sorted([(r["_began"], 1) for r in runs] + [(r["_began"] + r["end"], -1) for r in runs])
    live = peak = 0
    for _, step in events:
        live += step
        peak = max(peak, live)
    return peak


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


MARKS = (
    "preprocessed",
    "aggregated",
    "first text",
    "talker submitted",
    "first frame",
    "first window asked",
    "first window done",
    "first audio",
    "last text",
    "end",
)


def report(label: str, runs: list[dict[str, float]], wall_s: float | None = None) -> None:
    keys = [k for k in MARKS if all(k in r for r in runs)]
    heard = [r for r in runs if "_stall" in r]
    if heard:
        stalls = [r["_stall"] for r in heard]
        audio = sum(r["_audio"] for r in heard)
        print(
            f"  {label}: stall per stream mean {sum(stalls) / len(stalls):.3f} s, max {max(stalls):.3f} s;"
            f" real time {sum(s <= 1e-9 for s in stalls)}/{len(heard)};"
            f" chunks per stream {sum(r['_windows'] for r in heard) / len(heard):.1f}"
            + (f"; audio s/s {audio / wall_s:.1f}" if wall_s else "")
        )
    ends: dict[str, int] = {}
    for r in runs:
        ends[str(r.get("_talker_end"))] = ends.get(str(r.get("_talker_end")), 0) + 1
    codes = sorted(int(r["_talker_codes"]) for r in runs if "_talker_codes" in r)
    if codes:
        print(
            f"  {label}: talker ends {dict(sorted(ends.items()))}; codes min {codes[0]}, "
            f"median {codes[len(codes) // 2]}, max {codes[-1]}"
        )
    print(f"  {label} ({len(runs)} requests), p50 / p95 s:")
    print(
        "    "
        + ", ".join(
            f"{k} {quantile([r[k] for r in runs], 0.5):.3f}/{quantile([r[k] for r in runs], 0.95):.3f}"
            for k in keys
        )
    )


async def trace_level(engine: Any, hook: Marks, args: argparse.Namespace, c: int, name: str) -> None:
    """One wave of ``c`` replies with every kernel recorded (gpu_timeline.py): each stage stream's
    busy time, and the GPU's, over the wave and while replies were in their text phase."""
    from gpu_timeline import GpuTimeline, plot, print_summary

    local = getattr(engine.stages, "local", engine.stages)
    async with GpuTimeline(local.threads) as timeline:
        runs = await asyncio.gather(
            *(one(engine, hook, f"trace-c{c}-s{k}", args.talker_tokens, quiet=True) for k in range(c))
        )
    phases = [
        (r["_began"] + r["first text"] - timeline.t0, r["_began"] + r["last text"] - timeline.t0)
        for r in runs
        if "first text" in r
    ]
    summary = timeline.summary(phases)
    print(f"  GPU timeline, c={c}, one wave, {name} ({hook.take_calls()}):")
    report(f"traced c={c}", runs)
    print_summary(summary)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"timeline-c{c}-{name}".replace(" ", "").replace("=", "-").replace(",", "_")
        (args.out / f"{stem}.json").write_text(json.dumps(summary))
        plot(summary, args.out / f"{stem}.png", f"GPU per stage stream, c={c}, {name}")


def serial(engine: Any, on: bool) -> None:
    """Admit the talker's rows one prefill at a time (how the Qwen2.5 talker admitted them before
    its batched admission), or restore the runner's own ``admit``."""
    runner = getattr(engine.stages, "local", engine.stages).talker.runner
    own = runner.__dict__.pop("admit", None)
    own = getattr(own, "own", None) or runner.admit
    if on:

        def one_by_one(rows: list[Any]) -> list[Any]:
            return [code for row in rows for code in own([row])]

        one_by_one.own = own  # type: ignore[attr-defined]
        runner.admit = one_by_one


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# Variant keys that are not windows: thinker_hold_below_s sets which audio windows pause the thinker
# (deadlines.holds_thinker; null: none, -1e9: first windows only); vocoder_graphs false runs every
# vocoder window eagerly (models/window_graphs.py).
ENGINE_SWITCHES = (
    "serial_talker_admission",
    "stock_bigvgan",
    "stock_dit",
    "holds_spare_text",
    "thinker_hold_below_s",
    "vocoder_graphs",
    "windows_ahead",
    "vocoder_far",
    "vocoder_buckets",
    "prefill_graphs",
    "first_linger_codes",
)


def set_prefill(engine: Any, mode: str | None) -> str:
    """How the thinker and talker prefill fresh prompts (start-up captured their graphs unless
    ``OMNI_PREFILL_GRAPHS=0``): "graphs" (both replay them), "padded" (both run the padded body eagerly,
    no graph), "thinker" or "talker" (that stack's graphs only), "off" (both unpadded). None
    leaves each decoder as start-up left it. Returns what each decoder does now."""
    local = getattr(engine.stages, "local", engine.stages)
    shown = []
    for name in ("thinker", "talker"):
        decoder = getattr(getattr(local, name).runner, "decoder", None)
        if decoder is None or not hasattr(decoder, "prefill_padded"):
            continue
        if mode is not None:  # graphs only where start-up captured (and checked) them
            graphs = mode in ("graphs", name) and bool(decoder._prefill_graphs)
            decoder.prefill_graphs = graphs
            decoder.prefill_padded = graphs or mode == "padded"
        kind = "graphs" if decoder.prefill_graphs else "padded" if decoder.prefill_padded else "unpadded"
        shown.append(f"{name} {kind}")
    return ", ".join(shown)


async def prepare_vocoder(engine: Any, *, stock_bigvgan: bool, stock_dit: bool = False) -> None:
    """Put transformers' own anti-aliased activations into the Qwen2.5 BigVGAN (``stock_bigvgan``;
    else the Triton kernel's modules), and capture the graphs of the current windows' recurring sizes that
    are missing (all of them after a swap), on the vocoder's own thread, before a level runs."""
    from omni_runtime.models.qwen2_5_omni.bigvgan import FusedAntiAliasedSnake
    from omni_runtime.pipeline.segmenter import CodecSegmenter, family_config

    vocoder = vocoder_of(engine)
    if vocoder is None:
        return
    bigvgan = getattr(vocoder, "bigvgan", None)  # Qwen2.5's; Qwen3's Code2Wav has none
    swapped = 0
    for parent in list(bigvgan.modules()) if bigvgan is not None else []:
        for name, child in list(parent.named_children()):
            if stock_bigvgan and isinstance(child, FusedAntiAliasedSnake):
                object.__setattr__(child.stock[0], "fused", child)  # not a submodule
                setattr(parent, name, child.stock[0])
                swapped += 1
            elif not stock_bigvgan and isinstance(getattr(child, "fused", None), FusedAntiAliasedSnake):
                setattr(parent, name, child.fused)
                swapped += 1
    if getattr(vocoder, "stock_dit", stock_dit) != stock_dit:  # transformers' DiT block, or the runtime's
        vocoder.stock_dit = stock_dit  # drops its graphs, one-off sizes' too (the warm-up recaptures)
        swapped += 1
    if swapped:  # BigVGAN is in every graph, the one-off sizes' too
        vocoder.graphs.clear()
        if hasattr(vocoder, "tail_graphs"):
            vocoder.tail_graphs.clear()
    local = getattr(engine.stages, "local", engine.stages)
    sizes = CodecSegmenter(family_config(engine.adapter.codec_windows)).recurring_sizes()
    began = time.perf_counter()
    await local.threads["vocoder"].run(vocoder.warmup, sizes)
    activations = "stock" if stock_bigvgan else "fused"
    print(
        f"vocoder: {activations} activations ({swapped} swapped), window sizes {sorted(sizes)} warm "
        f"in {time.perf_counter() - began:.1f} s",
        flush=True,
    )


def write_levels(args: argparse.Namespace, levels: list[LevelSummary]) -> None:
    """The bench's own table, JSON and plot: one line per variant and level."""
    if not levels:
        return
    print(format_table(levels))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {"model": args.path, "talker_tokens": args.talker_tokens, "waves": args.waves}
        write_json(args.out / "levels.json", meta=meta, levels=levels, baselines=[])
        plot_speech(args.out / "speech.png", rows=levels, title="streaming speech, in-process engine")
        print(f"wrote {args.out}/levels.json, {args.out}/speech.png", flush=True)


def worst_stream(runs: list[dict[str, float]]) -> None:
    """The most stalled stream's first audio chunks: when each came, how long it plays, and the
    stall before it (playback from first audio, as bench.playback plays it)."""
    heard = [r for r in runs if "_stall" in r]
    if not heard:
        return
    worst = max(heard, key=lambda r: r["_stall"])
    ends_at, shown = None, []
    for chunk in TIMELINES[str(worst["_rid"])][:10]:
        gap = 0.0 if ends_at is None else max(0.0, chunk.arrival_s - ends_at)
        ends_at = (chunk.arrival_s if ends_at is None else max(ends_at, chunk.arrival_s)) + chunk.duration_s
        shown.append(f"{chunk.arrival_s:.3f}+{chunk.duration_s:.2f}" + (f" (stall {gap:.3f})" if gap else ""))
    print(f"    worst stream {worst['_rid']}: " + ", ".join(shown))


def thinker_of(engine: Any) -> Any:
    return getattr(engine.stages, "local", engine.stages).thinker


def vocoder_of(engine: Any) -> Any:
    local = getattr(engine.stages, "local", engine.stages)
    return getattr(local, "vocoder", None)


def time_vocoder(vocoder: Any, windows: dict[str, tuple[int, int, int, int]], *, groups: int) -> None:
    """Milliseconds per ``synthesize_many`` call, per window shape and batch (Qwen3's Code2Wav):
    eagerly and as the window's CUDA graph (a shape warm-up did not capture is captured here)."""
    for name, (ctx_start, start, end, ctx_end) in windows.items():
        for batch in (1, 8, 16):
            frames = [[(7 * i + g) % 1000 for g in range(groups)] for i in range(ctx_end)]
            window = {"start": start, "end": end, "ctx_start": ctx_start, "ctx_end": ctx_end}
            timings = []
            for reusable in (False, True):
                items = [{"codes": frames, "window": window, "reusable": reusable} for _ in range(batch)]
                for _ in range(2):
                    vocoder.synthesize_many(items)
                sync()
                t = time.perf_counter()
                for _ in range(5):
                    vocoder.synthesize_many(items)
                sync()
                timings.append((time.perf_counter() - t) / 5 * 1e3)
            print(
                f"vocoder {name} ({ctx_end - ctx_start} frames), batch {batch}: "
                f"eager {timings[0]:.1f} ms, graph {timings[1]:.1f} ms"
            )


async def main(args: argparse.Namespace) -> None:
    check_log = logging.getLogger("omni_runtime.executor.slot_cache")  # the prefill graphs' check
    check_log.setLevel(logging.INFO)
    check_log.addHandler(logging.StreamHandler())
    engine = build_engine(
        EngineOptions(
            model_path=args.path,
            load_format=args.load_format,
            device=args.device,
            pipeline="streaming-speech",
            max_batch_size=32,
        )
    )
    await engine.start()
    hook = Marks(engine)
    windows = dict(engine.adapter.codec_windows)
    print("codec windows:", windows)
    await one(engine, hook, "warm", 60, quiet=True)
    summary: dict[str, list[dict[str, float]]] = {}
    calls: dict[str, str] = {}
    for first in [None, *args.first_chunk]:
        label = "default" if first is None else f"first_chunk={first}"
        engine.adapter.codec_windows = windows if first is None else {**windows, "first_chunk": first}
        await one(engine, hook, f"warm-{label}", 30, quiet=True)
        hook.take_calls()
        summary[label] = [
            await one(engine, hook, f"{label}-r{i}", args.talker_tokens) for i in range(args.requests)
        ]
        calls[label] = hook.take_calls()
    engine.adapter.codec_windows = windows
    walls: dict[str, float] = {}
    levels: list[LevelSummary] = []
    for c in args.concurrency:  # every level's shapes once (thinker prefill, talker admission)
        await asyncio.gather(*(one(engine, hook, f"warm-c{c}-s{k}", 60, quiet=True) for k in range(c)))
    hook.take_calls()
    # As omni serve does once warm: full collections skip what is alive now; pauses are logged.
    freeze_heap("profile_speech")
    watch_gc(warn_above_s=0.05)
    hold_default = engine.thinker_hold_below_s
    ahead_default = engine.windows_ahead
    linger_default = engine.first_linger_codes
    far_default = getattr(engine.stages, "local", engine.stages).vocoder_worker.far
    buckets_default = vocoder_of(engine).graphs.buckets
    variants = args.window_variants if args.variants_only else [{}, *args.window_variants]
    for variant in variants:  # one switch per variant: a swap recaptures graphs
        overrides = {k: v for k, v in variant.items() if k not in ENGINE_SWITCHES}
        engine.adapter.codec_windows = {**windows, **overrides}
        serial(engine, bool(variant.get("serial_talker_admission")))
        engine.thinker_hold_below_s = variant.get("thinker_hold_below_s", hold_default)
        engine.holds_spare_text = bool(variant.get("holds_spare_text", True))
        engine.windows_ahead = int(variant.get("windows_ahead", ahead_default))
        engine.first_linger_codes = int(variant.get("first_linger_codes", linger_default))
        # [seconds, windows] or [seconds, windows, "near"] (near_only): deadlines.FarWindows; absent: the default
        far = variant.get("vocoder_far")
        worker = getattr(engine.stages, "local", engine.stages).vocoder_worker
        worker.far = (
            FarWindows(after_s=float(far[0]), batch=int(far[1]), near_only=far[2:] == ["near"])
            if far
            else far_default
        )
        vocoder = vocoder_of(
            engine
        )  # batch buckets (OMNI_VOCODER_BUCKETS): the warm-up below captures new ones
        buckets = tuple(variant.get("vocoder_buckets", buckets_default))
        for graphs in (vocoder.graphs, getattr(vocoder, "tail_graphs", None)):
            if graphs is not None:
                graphs.buckets = buckets
        await prepare_vocoder(
            engine, stock_bigvgan=bool(variant.get("stock_bigvgan")), stock_dit=bool(variant.get("stock_dit"))
        )
        if vocoder_of(engine) is not None:
            vocoder_of(engine).graphs.enabled = bool(variant.get("vocoder_graphs", True))
        print(f"prefill: {set_prefill(engine, variant.get('prefill_graphs'))}", flush=True)
        for c in args.concurrency:  # closed loop: c streams, each starting its next reply as one ends

            async def stream(k: int, c: int = c) -> list[dict[str, float]]:
                return [
                    await one(engine, hook, f"c{c}-s{k}-w{w}", args.talker_tokens, quiet=True)
                    for w in range(args.waves)
                ]

            label = f"c={c}, {args.waves} waves" + (f", {json.dumps(variant)}" if variant else "")
            hook.take_calls()
            held = thinker_of(engine).held_s
            began = time.perf_counter()
            summary[label] = [m for ms in await asyncio.gather(*(stream(k) for k in range(c))) for m in ms]
            walls[label] = time.perf_counter() - began
            calls[label] = hook.take_calls()
            report(label, summary[label], walls[label])  # as it goes: a cut-off run keeps its levels
            worst_stream(summary[label])
            vocoder = vocoder_of(engine)
            print(
                f"    thinker held {thinker_of(engine).held_s - held:.2f} s of {walls[label]:.2f} s; "
                f"vocoder eager calls so far {getattr(vocoder, 'eager_calls', None) if vocoder is not None else '?'}; "
                f"gen-2 collections {collections(2)}, longest {longest_pause(2) * 1000:.0f} ms",
                flush=True,
            )
            name = "default" if not variant else ", ".join(f"{k}={v}" for k, v in variant.items())
            levels.append(level_summary(name, c, summary[label], walls[label]))
            if c in args.trace_levels:  # one more wave under CUPTI, apart from the measured ones
                await trace_level(engine, hook, args, c, name)
        for rate in args.rates:  # open loop: Poisson arrivals, streams out of phase
            label = f"{rate:g}/s for {args.duration:g} s" + (f", {json.dumps(variant)}" if variant else "")
            hook.take_calls()
            began = time.perf_counter()
            runs = await open_loop(engine, hook, args, rate)
            if not runs:
                print(f"  {label}: no arrivals in {args.duration:g} s (seed {args.seed}); nothing to report")
                continue
            summary[label] = runs
            walls[label] = time.perf_counter() - began
            calls[label] = hook.take_calls()
            report(label, summary[label], walls[label])
            worst_stream(summary[label])
            name = "default" if not variant else ", ".join(f"{k}={v}" for k, v in variant.items())
            level = level_summary(name, 0, summary[label], walls[label])
            levels.append(replace(level, rate_per_s=rate, concurrency=peak_in_flight(summary[label])))
        write_levels(args, levels)  # after each variant, so a run cut off keeps what it measured
    engine.adapter.codec_windows = windows
    serial(engine, False)
    print("per variant:")
    for label, runs in summary.items():
        report(label, runs, walls.get(label))
        print(f"    runner calls: {calls.get(label, '')}")
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
    levels = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    parser.add_argument("--first-chunk", type=levels, default=[], help="other first windows to compare")
    parser.add_argument("--concurrency", type=levels, default=[], help="closed-loop levels, e.g. 16,32")
    parser.add_argument("--waves", type=int, default=2, help="replies per stream at each level")
    parser.add_argument(
        "--rates",
        type=lambda text: arrival_rates(text) if text.strip() else [],  # empty: none (speech_variants.sh)
        default=[],
        help="open-loop levels after the closed-loop ones: Poisson arrivals a second, e.g. 2",
    )

    def seconds(text: str) -> float:
        if float(text) <= 0:
            raise argparse.ArgumentTypeError(f"the duration must be > 0 seconds, got {text!r}")
        return float(text)

    parser.add_argument(
        "--duration", type=seconds, default=30.0, help="seconds of arrivals per open-loop level"
    )
    parser.add_argument("--seed", type=int, default=0, help="the arrivals' seed (omni bench --seed)")
    parser.add_argument(
        "--trace-levels",
        type=levels,
        default=[],
        help="after these levels, one more wave with every kernel recorded (gpu_timeline.py)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write levels.json and speech.png here")
    parser.add_argument(
        "--variants-only", action="store_true", help="only the --window-variants ({} is the default)"
    )
    parser.add_argument(
        "--window-variants",
        type=json.loads,
        default=[],
        help="JSON list of codec_windows overrides, each run at every level after the default",
    )
    asyncio.run(main(parser.parse_args()))
