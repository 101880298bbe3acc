"""Which audio chunk comes late: a speech run's timelines by chunk number.

``omni bench --out DIR`` writes ``DIR/requests.jsonl``, one row per request with its audio chunks
(arrival and seconds). A level's stall and closest call say *that* streams ran dry; this says
*where*: for the second chunk, the third and so on, how many streams stalled when it arrived, for
how long in all, and how much audio the listeners still had queued (least and median). Streaming
speech sends one chunk per vocoder window, so chunk 2 is the second window, the one a busy first
window must cover.

    python -m omni_runtime.bench.timelines DIR/requests.jsonl [--chunks 6]

Chunks past ``--chunks`` are pooled in one row (``7+``). Pure arithmetic over the file
(`playback.chunk_waits`, the same play head as the bench's stall numbers; the file keeps times to
0.1 ms, so a wait shorter than that may count here and not in the bench's row, or the reverse).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omni_runtime.bench.playback import Chunk, chunk_waits
from omni_runtime.bench.quantile import percentile


@dataclass(frozen=True)
class ChunkRow:
    """One chunk number of one level, over the streams that had that chunk."""

    level: str
    chunk: str  # "2", "3", ..., or "7+" for every chunk past the last one shown
    streams: int  # streams with such a chunk (for "7+": chunks)
    stalled: int  # of them, those that arrived after the listener ran dry
    stall_s: float  # the waits they caused, summed
    slack_min_s: float  # the least audio still queued when one arrived (negative: a wait)
    slack_p50_s: float


def by_chunk(rows: Iterable[dict[str, Any]], *, chunks: int = 6) -> list[ChunkRow]:
    """Rows of ``requests.jsonl`` (speech rows: those with ``chunks``, as `read_rows` checks
    them) to one row per level and chunk number from 2 to ``chunks``, then one for every later
    chunk; levels in file order."""
    if chunks < 2:
        raise ValueError(f"chunks is {chunks}: show at least the second chunk (2 or more)")
    heard: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for row in rows:
        timeline = row.get("chunks")
        if not timeline:
            continue
        per_level = heard.setdefault(str(row.get("level", "")), {})
        arrivals = chunk_waits([Chunk(float(arrival), float(seconds)) for arrival, seconds in timeline])
        for index, pair in enumerate(arrivals, start=2):
            key = str(index) if index <= chunks else f"{chunks + 1}+"
            per_level.setdefault(key, []).append(pair)
    out = []
    for level, per_chunk in heard.items():
        for key in sorted(per_chunk, key=lambda k: int(k.rstrip("+"))):
            slacks = [slack for slack, _ in per_chunk[key]]
            waits = [wait for _, wait in per_chunk[key] if wait > 0]
            out.append(
                ChunkRow(
                    level=level,
                    chunk=key,
                    streams=len(slacks),
                    stalled=len(waits),
                    stall_s=sum(waits),
                    slack_min_s=min(slacks),
                    slack_p50_s=percentile(slacks, 50),
                )
            )
    return out


def table(rows: Sequence[ChunkRow]) -> str:
    header = ("level", "chunk", "streams", "stalled", "stall s", "slack min", "slack p50")
    lines = [header] + [
        (
            r.level,
            r.chunk,
            str(r.streams),
            str(r.stalled),
            f"{r.stall_s:.3f}",
            f"{r.slack_min_s:+.3f}",
            f"{r.slack_p50_s:+.3f}",
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)) for line in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``requests.jsonl``; a line that is not a JSON object names its line number."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{path}:{number}: not JSON ({exc.msg}); expected omni bench's requests.jsonl"
            ) from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{number}: a JSON {type(row).__name__}, not a request row")
        if not _timeline_or_none(row.get("chunks")):
            raise ValueError(
                f"{path}:{number}: chunks must be a list of [arrival seconds, audio seconds] pairs "
                f"(or null), got {json.dumps(row.get('chunks'))[:80]}"
            )
        rows.append(row)
    return rows


def _timeline_or_none(chunks: Any) -> bool:
    if chunks is None:
        return True
    return isinstance(chunks, list) and all(
        isinstance(pair, list)
        and len(pair) == 2
        and all(isinstance(x, int | float) and not isinstance(x, bool) for x in pair)
        for pair in chunks
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m omni_runtime.bench.timelines",
        description="Where speech streams ran dry: omni bench's requests.jsonl by audio chunk number.",
    )
    parser.add_argument("requests", type=Path, help="requests.jsonl from omni bench --out")
    parser.add_argument("--chunks", type=int, default=6, help="chunk numbers shown one by one (default 6)")
    args = parser.parse_args(argv)
    try:
        rows = by_chunk(read_rows(args.requests), chunks=args.chunks)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print(
            f"error: {args.requests} has no speech stream with two or more audio chunks: run omni bench "
            "--mode speech --stream --out DIR against a streaming-speech deployment (the speech "
            "pipeline sends each reply's audio as one chunk)",
            file=sys.stderr,
        )
        return 2
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
