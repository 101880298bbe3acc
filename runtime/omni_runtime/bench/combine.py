"""One table and one set of plots from several bench result files, e.g. ours and the HF baseline's.

`omni bench` and `python -m omni_runtime.bench.hf_baseline` run at different times on the device
(the baseline needs the GPU the worker held), so their rows meet here afterwards::

    python -m omni_runtime.bench.combine --speech speech/bench.json hf.json --out combined/
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omni_runtime.bench.report import format_table, load_baselines, plot, plot_speech
from omni_runtime.bench.stats import LevelSummary


def rows_of(paths: list[Path], *, speech_only: bool) -> list[LevelSummary]:
    """The ``levels`` rows of every file, in order; `speech_only` keeps rows with listener numbers."""
    rows = [row for path in paths for row in load_baselines(path)]
    return [row for row in rows if row.audio_streams is not None] if speech_only else rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m omni_runtime.bench.combine", description=__doc__)
    p.add_argument(
        "files", type=Path, nargs="+", help="bench.json files (omni bench --out, hf_baseline --out)"
    )
    p.add_argument("--speech", action="store_true", help="only rows with listener numbers (speech levels)")
    p.add_argument("--out", type=Path, help="directory for bench.png (and speech.png)")
    p.add_argument("--title", default="omni bench", help="plot title")
    args = p.parse_args(argv)
    try:
        rows = rows_of(args.files, speech_only=args.speech)
    except (OSError, ValueError) as exc:
        print(f"bench.combine: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print("bench.combine: no rows in these files", file=sys.stderr)
        return 1
    print(format_table(rows))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        plot(args.out / "bench.png", rows=rows, title=args.title)
        if any(row.audio_streams for row in rows):
            plot_speech(args.out / "speech.png", rows=rows, title=args.title)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
