"""The benchmark report: a table for the terminal, a JSON file and a PNG plot (matplotlib, Agg).

Baseline rows (e.g. plain HF ``generate`` measured by another tool) come from a JSON file and sit
next to ours in the table and the plot, each with its own label.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omni_runtime.bench.stats import LevelSummary

_COLUMNS = (
    ("label", "label", "{}"),
    ("conc", "concurrency", "{}"),
    ("ok/all", None, ""),
    ("req/s", "requests_per_s", "{:.2f}"),
    ("tok/s", "output_tokens_per_s", "{:.1f}"),
    ("lat mean", "latency_mean_s", "{:.3f}"),
    ("lat p50", "latency_p50_s", "{:.3f}"),
    ("lat p95", "latency_p95_s", "{:.3f}"),
    ("ttft p50", "ttft_p50_s", "{:.3f}"),
    ("ttfa p50", "ttfa_p50_s", "{:.3f}"),
)


def format_table(rows: Sequence[LevelSummary]) -> str:
    """A fixed-width table; times in seconds, '-' where a number does not apply."""
    cells: list[list[str]] = [[title for title, _, _ in _COLUMNS]]
    for row in rows:
        line = []
        for _title, field, fmt in _COLUMNS:
            if field is None:
                line.append(f"{row.requests - row.failed}/{row.requests}" if row.requests else "-")
                continue
            value = getattr(row, field)
            line.append("-" if value is None else fmt.format(value))
        cells.append(line)
    widths = [max(len(r[i]) for r in cells) for i in range(len(_COLUMNS))]
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


def plot(path: Path, *, rows: Sequence[LevelSummary], title: str) -> None:
    """Throughput and latency against concurrency, one line per label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(r.label for r in rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label in labels:
        series = sorted((r for r in rows if r.label == label), key=lambda r: r.concurrency)
        xs = [r.concurrency for r in series]
        left.plot(xs, [r.output_tokens_per_s for r in series], marker="o", label=label)
        for field, style, name in (
            ("latency_p50_s", "-", "latency p50"),
            ("latency_p95_s", "--", "latency p95"),
            ("ttft_p50_s", ":", "TTFT p50"),
            ("ttfa_p50_s", "-.", "first audio p50"),
        ):
            points = [(r.concurrency, getattr(r, field)) for r in series if getattr(r, field) is not None]
            if points:
                right.plot(*zip(*points, strict=True), linestyle=style, marker="o", label=f"{label}: {name}")
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrency")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    left.set_ylabel("output tokens / s")
    left.set_title("throughput")
    right.set_ylabel("seconds")
    right.set_title("latency")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
