"""What a worker's own /metrics say about a bench level: read before and after it, the difference.

``stages``: each stage thread's share of the level's wall time (``omni_stage_busy_seconds``; the
stage near 1.0 is the one the work queued behind). ``waits``: per stage and kind of work, what
waited for that stage's calls (``omni_stage_wait_seconds``): how many, their mean, and the share
over 0.1 s. ``first_audio_phases``: the worker's own time to first audio of the level's streaming
speech replies, split by phase (``omni_first_audio_phase_seconds``, in the worker's order:
``contract.engine.FIRST_AUDIO_PHASES``); their means add up to the worker's part of the time to
first audio, from the engine's acceptance to the first audio leaving it. ``loop_lag``: how late the
worker's event loop woke its lag watch (``omni_event_loop_lag_seconds``), a share of what lies
outside those phases. Behind a router, or where /metrics cannot be read, there is nothing to
report and the bench says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from omni_runtime.bench.cancel_tail import BUSY, stage_counters
from omni_runtime.bench.stats import LevelSummary
from omni_runtime.contract.engine import FIRST_AUDIO_PHASES
from omni_runtime.support.loop_lag import METRIC as LAG

WAIT = "omni_stage_wait_seconds"
PHASE = "omni_first_audio_phase_seconds"


def stage_shares(before: str, after: str, wall_s: float) -> dict[str, float]:
    """Each stage's busy seconds gained between two /metrics texts, over ``wall_s``, to 0.1%
    (stages below that are left out)."""
    old, new = stage_counters(before, BUSY), stage_counters(after, BUSY)
    shares = {stage: round((value - old.get(stage, 0.0)) / wall_s, 3) for stage, value in new.items()}
    return {stage: share for stage, share in sorted(shares.items()) if share > 0}


def _histogram_samples(
    text: str, name: str, labels: tuple[str, ...], bound: float = 0.1
) -> dict[str, dict[str, float]]:
    """``a/b`` (the ``labels``' values) -> count, sum and the count at or under ``bound`` seconds
    (a bucket's upper bound), from one /metrics text's histogram ``name``."""
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            row = found.setdefault("/".join(sample.labels[label] for label in labels), {})
            if sample.name == name + "_count":
                row["count"] = sample.value
            elif sample.name == name + "_sum":
                row["sum"] = sample.value
            elif sample.name == name + "_bucket" and float(sample.labels["le"]) == bound:
                row["within"] = sample.value
    return found


def histogram_deltas(
    before: str, after: str, name: str, labels: tuple[str, ...], bound: float = 0.1
) -> dict[str, dict[str, float]]:
    """What a histogram gained between two /metrics texts, per series: the count, the mean and
    the share over ``bound`` seconds, ``over_<bound>s`` (series with nothing new are left out)."""
    old = _histogram_samples(before, name, labels, bound)
    new = _histogram_samples(after, name, labels, bound)
    gained: dict[str, dict[str, float]] = {}
    for key, row in sorted(new.items()):
        was = old.get(key, {})
        count = row.get("count", 0.0) - was.get("count", 0.0)
        if count <= 0:
            continue
        over = count - (row.get("within", 0.0) - was.get("within", 0.0))
        gained[key] = {
            "n": int(count),
            "mean_s": round((row.get("sum", 0.0) - was.get("sum", 0.0)) / count, 4),
            f"over_{bound:g}s": round(over / count, 3),
        }
    return gained


def stage_waits(before: str, after: str) -> dict[str, dict[str, float]]:
    """What waited for each stage's calls between two /metrics texts, by ``stage/kind``."""
    return histogram_deltas(before, after, WAIT, ("stage", "kind"))


def first_audio_phases(before: str, after: str) -> dict[str, dict[str, float]]:
    """Where the replies' time to first audio went inside the worker, by phase."""
    return histogram_deltas(before, after, PHASE, ("phase",))


def loop_lag(before: str, after: str) -> dict[str, float] | None:
    """How late the worker's event loop woke between two /metrics texts: wakes, mean lateness and
    the share over 10 ms (None before a worker had the metric)."""
    return histogram_deltas(before, after, LAG, (), bound=0.01).get("")


def worker_report(before: str | None, after: str | None, wall_s: float) -> dict[str, Any]:
    """``stages``, ``waits``, ``first_audio_phases`` and ``loop_lag`` between two /metrics texts;
    empty where either could not be read."""
    if before is None or after is None:
        return {}
    return {
        "stages": stage_shares(before, after, wall_s),
        "waits": stage_waits(before, after),
        "first_audio_phases": first_audio_phases(before, after),
        "loop_lag": loop_lag(before, after),
    }


def worker_first_audio_s(phases: dict[str, dict[str, float]]) -> float | None:
    """The worker's mean time to first audio: the sum of every phase's mean, or None unless each
    phase was recorded (a reply records all of them or none)."""
    if not phases or any(phase not in phases for phase in FIRST_AUDIO_PHASES):
        return None
    return round(sum(phases[phase]["mean_s"] for phase in FIRST_AUDIO_PHASES), 4)


def first_audio_line(
    load: str,
    phases: dict[str, dict[str, float]],
    client_ttfa_mean_s: float | None,
    lag: dict[str, float] | None = None,
) -> str | None:
    """One line of where a level's time to first audio went: each phase's mean inside the
    worker, their sum, what the client saw beyond it (the API, the transport, the client
    itself) and, from ``lag`` (``loop_lag``), how late the worker's event loop ran meanwhile;
    None where the worker recorded no phases."""
    inside = worker_first_audio_s(phases)
    if inside is None:
        return None
    parts = " + ".join(f"{phase} {phases[phase]['mean_s']:.3f}" for phase in FIRST_AUDIO_PHASES)
    line = f"  {load}: worker {parts} = {inside:.3f} s"
    if client_ttfa_mean_s is not None:
        line += f"; client TTFA mean {client_ttfa_mean_s:.3f} s, {client_ttfa_mean_s - inside:+.3f} s outside the worker"
    if lag is not None:
        line += (
            f"; event loop {1000 * lag['mean_s']:.1f} ms late a wake on average, "
            f"{lag['over_0.01s']:.0%} of {lag['n']} wakes over 10 ms"
        )
    return line


async def fetch_metrics(url: str | None) -> str | None:
    """A worker's /metrics text, or None (no URL, unreachable, or not 200)."""
    if url is None:
        return None
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            response = await http.get(url)
        return response.text if response.status_code == 200 else None
    except httpx.HTTPError:
        return None


def first_audio_report(levels: Sequence[LevelSummary], *, url: str) -> str:
    """Per level, where the time to first audio went (`first_audio_line`), or one line saying
    that ``url`` had no first-audio phases."""
    lines = [f"where the time to first audio went, means (the worker's {url}):"]
    for level in levels:
        phases = (level.worker or {}).get("first_audio_phases") or {}
        lag = (level.worker or {}).get("loop_lag")
        if (line := first_audio_line(level.load, phases, level.ttfa_mean_s, lag)) is not None:
            lines.append(line)
    if len(lines) == 1:
        return (
            f"no first-audio phases at {url}: a worker's /metrics has them for its streaming speech replies"
        )
    return "\n".join(lines)
