"""Summarise py-spy's collapsed stacks (``record -f raw --threads``, as tests/gpu/spy_speech.sh
writes them): samples per thread, then each busy thread's heaviest frames, by self time (the
innermost frame) and by inclusive time (anywhere on the stack).

    python tests/gpu/spy_top.py $OUT/spy/server.txt [--top 15]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from pathlib import Path

LINE_NO = re.compile(r":\d+\)$")


def frame_name(frame: str) -> str:
    """``fn (path/to/file.py:123)`` without its line number, path shortened to the last parts."""
    frame = LINE_NO.sub(")", frame.strip())
    if "(" in frame:
        fn, _, where = frame.partition(" (")
        parts = where.rstrip(")").split("/")
        return f"{fn} ({'/'.join(parts[-2:])})"
    return frame


def read(path: Path) -> dict[str, list[tuple[list[str], int]]]:
    threads: dict[str, list[tuple[list[str], int]]] = defaultdict(list)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = next((f for f in frames if f.startswith("thread ")), "thread ?")
        body = [frame_name(f) for f in frames if not f.startswith(("thread ", "process "))]
        threads[thread].append((body, int(count)))
    return threads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path", type=Path)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument(
        "--min-share", type=float, default=0.02, help="threads below this share are listed only"
    )
    args = parser.parse_args()
    threads = read(args.path)
    total = sum(c for rows in threads.values() for _, c in rows)
    print(f"{args.path}: {total} samples")
    order = sorted(threads, key=lambda t: -sum(c for _, c in threads[t]))
    for thread in order:
        rows = threads[thread]
        n = sum(c for _, c in rows)
        print(f"  {thread}: {n} samples ({100 * n / max(total, 1):.1f}%)")
    for thread in order:
        rows = threads[thread]
        n = sum(c for _, c in rows)
        if n < args.min_share * total:
            continue
        own: Counter[str] = Counter()
        incl: Counter[str] = Counter()
        for body, c in rows:
            if body:
                own[body[-1]] += c
            for name in set(body):
                incl[name] += c
        print(f"\n== {thread}: {n} samples")
        print("  self:")
        for name, c in own.most_common(args.top):
            print(f"    {100 * c / n:5.1f}%  {name}")
        print("  inclusive:")
        for name, c in incl.most_common(args.top * 2):
            print(f"    {100 * c / n:5.1f}%  {name}")


if __name__ == "__main__":
    main()
