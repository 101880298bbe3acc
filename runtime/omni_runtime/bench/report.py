"""The benchmark report: a table for the terminal, a JSON file and a PNG plot (matplotlib, Agg).

Baseline rows (e.g. plain HF ``generate`` measured by another tool) come from a JSON file and sit
next to ours in the table and the plot, each with its own label. When any row carries speech
numbers the table grows the listener's columns (TTFA percentiles, underrun per stream, RTF, streams
in real time, audio seconds per second, and with several closed-loop waves the TTFA p50 of the
first wave, whose requests all start together, beside that of the later ones) and `plot_speech`
draws TTFA and stall per level.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omni_runtime.bench.stats import LevelSummary

_COLUMNS = (
    ("label", "label", "{}"),
    ("load", "load", "{}"),
    ("ok/all", None, ""),
    ("req/s", "requests_per_s", "{:.2f}"),
    ("tok/s", "output_tokens_per_s", "{:.1f}"),
    ("lat mean", "latency_mean_s", "{:.3f}"),
    ("lat p50", "latency_p50_s", "{:.3f}"),
    ("lat p95", "latency_p95_s", "{:.3f}"),
    ("ttft p50", "ttft_p50_s", "{:.3f}"),
    ("tpot p50", "tpot_p50_s", "{:.4f}"),  # seconds a token after the first, streamed
    ("tpot p95", "tpot_p95_s", "{:.4f}"),
    ("ttfa p50", "ttfa_p50_s", "{:.3f}"),
)
_SPEECH_COLUMNS = (
    ("ttfa p95", "ttfa_p95_s", "{:.3f}"),
    ("ttfa p99", "ttfa_p99_s", "{:.3f}"),
    ("stall/str", "stall_mean_s", "{:.3f}"),
    ("stall max", "stall_max_s", "{:.3f}"),
    ("closest", "closest_s", "{:.3f}"),  # least audio left as a chunk came (negative: a wait)
    ("rtf p50", "rtf_p50", "{:.3f}"),
    ("rt/str", None, ""),
    ("audio s/s", "audio_s_per_s", "{:.2f}"),
    ("audio/str min", "stream_audio_min_s", "{:.2f}"),  # a reply cut short shows here
    ("audio/str p50", "stream_audio_p50_s", "{:.2f}"),
    ("ttfa 1st wave", "ttfa_first_wave_p50_s", "{:.3f}"),  # p50 of the first C requests sent
    ("ttfa later", "ttfa_later_p50_s", "{:.3f}"),  # p50 of the rest
)


def _cell(row: LevelSummary, title: str, field: str | None, fmt: str) -> str:
    if field is not None:
        value = getattr(row, field)
        return "-" if value is None else fmt.format(value)
    if title == "ok/all":
        return f"{row.requests - row.failed}/{row.requests}" if row.requests else "-"
    # rt/str: streams that stayed real time out of the streams that got audio
    return "-" if row.audio_streams is None else f"{row.realtime_streams}/{row.audio_streams}"


def format_table(rows: Sequence[LevelSummary]) -> str:
    """A fixed-width table; times in seconds, '-' where a number does not apply."""
    columns = _COLUMNS + (_SPEECH_COLUMNS if any(r.audio_streams is not None for r in rows) else ())
    cells: list[list[str]] = [[title for title, _, _ in columns]]
    cells.extend([_cell(row, *column) for column in columns] for row in rows)
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def load_baselines(path: Path) -> list[LevelSummary]:
    """Rows from ``{"levels": [...]}`` or a bare list; each row needs label, concurrency and the two rates."""
    data: Any = json.loads(path.read_text())
    rows = data.get("levels", data.get("rows")) if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise ValueError(f'{path}: expected a list of rows or {{"levels": [...]}}')
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: row {i} is not an object")
        try:
            out.append(LevelSummary.from_json(row))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: row {i}: {exc}") from exc
    return out


def write_json(
    path: Path, *, meta: dict[str, Any], levels: Sequence[LevelSummary], baselines: Sequence[LevelSummary]
) -> None:
    payload = {
        "meta": meta,
        "levels": [r.to_json() for r in levels],
        "baselines": [r.to_json() for r in baselines],
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")


def _series(rows: Sequence[LevelSummary]) -> list[tuple[str, list[LevelSummary]]]:
    """One line per label and load shape, ordered by its x: concurrency, or arrival rate."""
    keys = list(dict.fromkeys((r.label, r.rate_per_s is not None) for r in rows))
    out = []
    for label, open_loop in keys:
        series = sorted(
            (r for r in rows if r.label == label and (r.rate_per_s is not None) == open_loop), key=_x
        )
        out.append((f"{label} (open loop)" if open_loop else label, series))
    return out


def _x(row: LevelSummary) -> float:
    return row.rate_per_s if row.rate_per_s is not None else row.concurrency


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(path: Path, *, rows: Sequence[LevelSummary], title: str) -> None:
    """Throughput and latency against concurrency (or arrival rate), one line per label."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, series in _series(rows):
        xs = [_x(r) for r in series]
        left.plot(xs, [r.output_tokens_per_s for r in series], marker="o", label=label)
        for field, style, name in (
            ("latency_p50_s", "-", "latency p50"),
            ("latency_p95_s", "--", "latency p95"),
            ("ttft_p50_s", ":", "TTFT p50"),
            ("ttfa_p50_s", "-.", "first audio p50"),
        ):
            _line(right, series, field, style, f"{label}: {name}")
    _finish(plt, fig, path, title, left=("output tokens / s", "throughput"), right=("seconds", "latency"))


def _line(axis: Any, series: list[LevelSummary], field: str, style: str, name: str) -> None:
    points = [(_x(r), getattr(r, field)) for r in series if getattr(r, field) is not None]
    if points:
        axis.plot(*zip(*points, strict=True), linestyle=style, marker="o", label=name)


def _finish(
    plt: Any,
    fig: Any,
    path: Path,
    title: str,
    *,
    left: tuple[str, str],
    right: tuple[str, str],
    xlabel: str = "concurrency (open loop: arrivals/s)",
) -> None:
    """Log-2 x axes, grids, legends, each axis's (y label, title); save and close."""
    entries = max(len(axis.get_legend_handles_labels()[0]) for axis in fig.axes)
    below = entries > 8  # many variants: the legend under each axis, not over the lines
    if below:
        fig.set_size_inches(12, 4.5 + 0.16 * ((entries + 1) // 2))
    for axis, (ylabel, name) in zip(fig.axes, (left, right), strict=True):
        axis.set_xscale("log", base=2)
        axis.set_xlabel(xlabel)
        axis.grid(True, alpha=0.3)
        if below:
            axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
        else:
            axis.legend(fontsize=8)
        axis.set_ylabel(ylabel)
        axis.set_title(name)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight" if below else None)
    plt.close(fig)


def plot_speech(path: Path, *, rows: Sequence[LevelSummary], title: str) -> None:
    """What a listener hears, per level: TTFA p50/p95/p99 and underrun seconds per stream."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, series in _series([r for r in rows if r.audio_streams]):
        for field, style, name in (
            ("ttfa_p50_s", "-", "p50"),
            ("ttfa_p95_s", "--", "p95"),
            ("ttfa_p99_s", ":", "p99"),
        ):
            _line(left, series, field, style, f"{label}: {name}")
        for field, style, name in (("stall_mean_s", "-", "mean"), ("stall_max_s", "--", "max")):
            _line(right, series, field, style, f"{label}: {name}")
    _finish(
        plt,
        fig,
        path,
        title,
        left=("seconds", "time to first audio"),
        right=("underrun seconds per stream", "playback stall (playback starts at first audio)"),
    )


def plot_decode(path: Path, results: dict[str, Any]) -> None:
    """``bench.decode``'s results: ms per decode step against batch size for each runtime build,
    HF ``generate`` and the bandwidth bound (left), and each build as a multiple of the bound
    (right)."""
    plt = _pyplot()
    rows = results["rows"]
    batches = [row["batch"] for row in rows]
    bound = [row["bandwidth_bound_ms_per_step"] for row in rows]
    builds: dict[str, list[float]] = {}
    for row in rows:
        by_build = row.get("runtime_ms_per_step_by_experts_kernel") or {"runtime": row["runtime_ms_per_step"]}
        for name, ms in by_build.items():
            builds.setdefault(name, []).append(ms)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, ms in builds.items():
        left.plot(batches, ms, marker="o", label=f"runtime: {name}")
        right.plot(batches, [m / b for m, b in zip(ms, bound, strict=True)], marker="o", label=name)
    generate = [
        (row["batch"], row["generate_ms_per_step"]) for row in rows if row.get("generate_ms_per_step")
    ]
    if generate:
        left.plot(*zip(*generate, strict=True), marker="s", linestyle="--", label="HF generate")
    left.plot(batches, bound, linestyle=":", color="black", label="bandwidth bound")
    left.set_yscale("log")
    right.axhline(1.0, linestyle=":", color="black")
    _finish(
        plt,
        fig,
        path,
        f"thinker decode step on {results['gpu']} ({results.get('family', '')}, {results['dtype']})",
        left=("ms per step", "step time"),
        right=("x bandwidth bound", "distance from the bound"),
        xlabel="batch (rows per step)",
    )
