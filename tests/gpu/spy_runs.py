"""Where a thread sat still: runs of one stack in a py-spy speedscope profile.

``py-spy record --idle --threads -f speedscope`` keeps every sample of every thread in order, one
per 1/rate seconds, so a run of identical consecutive samples is a stretch of time the thread
spent in one place (a GPU wait, a lock, a long kernel launch). This prints, per thread whose name
matches ``--threads``, each run longer than ``--min-ms`` that is not the thread idling between
calls, with its offset from the start of the recording and its innermost frames (``--native``
recordings name the CUDA driver call a wait is in).

    py-spy record --native --idle --threads -r 200 -f speedscope -o spy.json --pid PID
    python tests/gpu/spy_runs.py spy.json --threads stage- --min-ms 50
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

# Innermost frames of a thread waiting for its next call: a pool worker blocked on its queue.
IDLE = ("_worker (concurrent/futures/thread.py", "get (queue.py")


def runs(
    samples: list[list[int]], weights: list[float], *, min_s: float
) -> list[tuple[float, float, list[int]]]:
    """(start, length, stack) of each run of equal consecutive samples lasting at least ``min_s``."""
    found: list[tuple[float, float, list[int]]] = []
    start = at = 0.0
    for i, stack in enumerate(samples):
        if i and stack != samples[i - 1]:
            if at - start >= min_s:
                found.append((start, at - start, samples[i - 1]))
            start = at
        at += weights[i]
    if samples and at - start >= min_s:
        found.append((start, at - start, samples[-1]))
    return found


def frame_label(frame: dict[str, Any]) -> str:
    where = frame.get("file") or ""
    where = "/".join(where.split("/")[-2:])
    line = frame.get("line")
    return f"{frame['name']} ({where}{':' + str(line) if line else ''})" if where else frame["name"]


def is_idle(labels: list[str]) -> bool:
    """The innermost Python frame is a pool worker waiting for its next call."""
    python = [label for label in labels if ".py:" in label or ".py)" in label]
    return bool(python) and python[-1].startswith(IDLE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--threads", default="stage-", help="regex on the thread's name")
    parser.add_argument("--min-ms", type=float, default=50.0)
    parser.add_argument("--frames", type=int, default=8, help="innermost frames shown per run")
    args = parser.parse_args(argv)
    data = json.loads(args.profile.read_text())
    frames = data["shared"]["frames"]
    for profile in data["profiles"]:
        if not re.search(args.threads, profile["name"]):
            continue
        print(f"== {profile['name']}: {profile['endValue'] - profile['startValue']:.2f} s sampled")
        for start, length, stack in runs(profile["samples"], profile["weights"], min_s=args.min_ms / 1e3):
            labels = [frame_label(frames[i]) for i in stack]
            if is_idle(labels):
                continue
            print(f"  at {start:8.3f} s for {length * 1e3:6.0f} ms:")
            for label in reversed(labels[-args.frames :]):
                print(f"      {label}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
