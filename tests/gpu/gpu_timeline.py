"""What the GPU did while a speech level ran: busy time per stage stream, over time.

Used by profile_speech.py ``--trace-levels``. CUPTI (torch.profiler, CUDA activity only) records
every kernel of the process, graph replays' kernels included, with the stream it ran on. Each
stage thread first runs a spin kernel of its own length on its own stream, so the summary can
name streams by stage. Per stream: kernels, busy seconds, the heaviest kernels; per time bin:
each stream's busy fraction and the union's (the GPU doing anything), and how many replies were
in their text phase then (the phase where a Qwen2.5 talker waits for the thinker's text).

    python tests/gpu/gpu_timeline.py --self-check   # the interval arithmetic, on a CPU
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SPIN_CYCLES = 2_000_000  # per marker rank: stage k's spin runs (k + 1) times this
TOP_KERNELS = 25  # heaviest kernels kept per stream in the summary


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Seconds covered by at least one of the (start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def clipped(intervals: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def binned(intervals: list[tuple[float, float]], span: float, bin_s: float) -> list[float]:
    """Busy fraction of each ``bin_s`` bin in [0, span) (intervals may overlap: their union)."""
    bins = max(1, int(span / bin_s + 0.999))
    return [union_length(clipped(intervals, k * bin_s, (k + 1) * bin_s)) / bin_s for k in range(bins)]


def summarize(
    kernels: list[tuple[int, str, float, float]],
    stages: dict[int, str],
    text_phases: list[tuple[float, float]],
    *,
    bin_s: float = 0.05,
) -> dict[str, Any]:
    """``kernels``: (stream, name, start s, end s) relative to the level's start; ``stages``: stream
    -> stage name; ``text_phases``: each reply's (first text, last text) on the same clock."""
    by_stream: dict[int, list[tuple[float, float]]] = defaultdict(list)
    names: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for stream, name, start, end in kernels:
        by_stream[stream].append((start, end))
        entry = names[stream][name]
        entry[0] += end - start
        entry[1] += 1
    span = max((e for _, _, _, e in kernels), default=0.0)
    every = [iv for ivs in by_stream.values() for iv in ivs]
    text_union = union_length(text_phases)
    out: dict[str, Any] = {
        "span_s": span,
        "bin_s": bin_s,
        "gpu_busy_s": union_length(every),
        "text_phase_s": text_union,
        "gpu_busy_in_text_phase_s": sum(union_length(clipped(every, s, e)) for s, e in _merged(text_phases)),
        "streams": {},
        "bins": {"any": binned(every, span, bin_s)},
    }
    out["replies_in_text"] = [
        sum(1 for s, e in text_phases if s < (k + 1) * bin_s and e > k * bin_s)
        for k in range(len(out["bins"]["any"]))
    ]
    for stream, ivs in sorted(by_stream.items(), key=lambda kv: -union_length(kv[1])):
        stage = stages.get(stream, f"stream {stream}")
        top = sorted(names[stream].items(), key=lambda kv: -kv[1][0])[:TOP_KERNELS]
        out["streams"][stage] = {
            "stream": stream,
            "kernels": len(ivs),
            "busy_s": union_length(ivs),
            "busy_in_text_phase_s": sum(union_length(clipped(ivs, s, e)) for s, e in _merged(text_phases)),
            "top": [{"name": n[:120], "ms": t * 1e3, "count": int(c)} for n, (t, c) in top],
        }
        out["bins"][stage] = binned(ivs, span, bin_s)
    return out


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


class GpuTimeline:
    """``async with GpuTimeline(threads) as tl: ...level...``; then ``tl.summary(text_phases)``.

    ``threads``: the engine's stage threads by name (``StageThread.run``)."""

    def __init__(self, threads: dict[str, Any]) -> None:
        self.threads = threads
        self.prof: Any = None
        self.t0 = 0.0

    async def __aenter__(self) -> GpuTimeline:
        import torch
        from torch.profiler import ProfilerActivity, profile

        self.prof = profile(activities=[ProfilerActivity.CUDA])
        self.prof.__enter__()
        self.order = sorted(self.threads)
        for rank, name in enumerate(self.order):  # one spin per stage stream, in rank order

            def spin(cycles: int = (rank + 1) * SPIN_CYCLES) -> None:
                torch.cuda._sleep(cycles)
                torch.cuda.current_stream().synchronize()

            await self.threads[name].run(spin)
        self.t0 = time.perf_counter()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        import torch

        torch.cuda.synchronize()
        self.prof.__exit__(None, None, None)

    def summary(self, text_phases: list[tuple[float, float]], bin_s: float = 0.05) -> dict[str, Any]:
        """``text_phases`` in seconds after ``self.t0`` (perf_counter when the markers were done)."""
        from torch.autograd import DeviceType

        raw = []
        for ev in self.prof.profiler.kineto_results.events():
            if ev.device_type() != DeviceType.CUDA:
                continue
            raw.append((ev.device_resource_id(), ev.name(), ev.start_ns() / 1e9, ev.end_ns() / 1e9))
        spins = sorted((e - s, stream, e) for stream, name, s, e in raw if "spin" in name.lower())
        stages = {stream: self.order[k] for k, (_, stream, _) in enumerate(spins[: len(self.order)])}
        # The last marker ended just before t0: the clock's origin (GPU time to perf_counter time).
        origin = max(e for _, _, e in spins) if spins else min(s for _, _, s, _ in raw)
        kernels = [
            (st, n, s - origin, e - origin) for st, n, s, e in raw if s >= origin and "spin" not in n.lower()
        ]
        return summarize(kernels, stages, text_phases, bin_s=bin_s)


def plot(summary: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bin_s = summary["bin_s"]
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(11, 6), sharex=True, height_ratios=[3, 1])
    for stage, values in summary["bins"].items():
        xs = [k * bin_s for k in range(len(values))]
        ax.plot(
            xs, values, label=stage, lw=1.6 if stage == "any" else 1.0, color="k" if stage == "any" else None
        )
    ax.set_ylabel("busy fraction of each bin")
    ax.set_ylim(0, 1.05)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(title)
    counts = summary["replies_in_text"]
    bx.step([k * bin_s for k in range(len(counts))], counts, where="post")
    bx.set_ylabel("replies in text")
    bx.set_xlabel("seconds after the level started")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_summary(summary: dict[str, Any]) -> None:
    text = summary["text_phase_s"] or float("nan")
    print(
        f"  GPU busy {summary['gpu_busy_s']:.2f} s of {summary['span_s']:.2f} s; while any reply was in its text "
        f"phase ({summary['text_phase_s']:.2f} s): busy {summary['gpu_busy_in_text_phase_s'] / text:.0%}"
    )
    for stage, s in summary["streams"].items():
        print(
            f"    {stage}: {s['kernels']} kernels, busy {s['busy_s']:.2f} s "
            f"({s['busy_in_text_phase_s'] / text:.0%} of the text phase); heaviest: "
            + "; ".join(f"{t['name'][:50]} {t['ms']:.0f} ms x{t['count']}" for t in s["top"][:3])
        )


def _self_check() -> None:
    assert union_length([(0, 1), (0.5, 2), (3, 4)]) == 3.0
    assert union_length([(0, 4), (1, 2)]) == 4.0
    assert [round(b, 9) for b in binned([(0.0, 0.05), (0.075, 0.1)], 0.1, 0.05)] == [1.0, 0.5]
    s = summarize(
        [(7, "gemm", 0.0, 0.1), (9, "conv", 0.05, 0.2), (7, "gemm", 0.3, 0.4)],
        {7: "thinker", 9: "vocoder"},
        [(0.0, 0.2), (0.1, 0.3)],
        bin_s=0.1,
    )
    assert abs(s["gpu_busy_s"] - 0.3) < 1e-12 and abs(s["gpu_busy_in_text_phase_s"] - 0.2) < 1e-12, s
    assert s["streams"]["thinker"]["kernels"] == 2 and abs(s["streams"]["thinker"]["busy_s"] - 0.2) < 1e-12
    assert s["replies_in_text"] == [1, 2, 1, 0], s["replies_in_text"]
    print(json.dumps(s["bins"]))
    print("ok")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--self-check", action="store_true")
    if parser.parse_args().self_check:
        _self_check()
