"""Benchmark statistics: per-request samples in, one summary per concurrency level out (pure)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class RequestSample:
    """One request as the client saw it (seconds from sending it)."""

    ok: bool
    latency_s: float
    ttft_s: float | None = None  # first text token
    ttfa_s: float | None = None  # first audio bytes
    output_tokens: int = 0
    text_deltas: int = 0
    audio_chunks: int = 0
    error: str | None = None


@dataclass(frozen=True)
class LevelSummary:
    label: str  # "omni" for our runs; baseline rows carry their own label (e.g. "hf-generate")
    concurrency: int
    requests: int
    failed: int
    wall_s: float
    requests_per_s: float
    output_tokens_per_s: float
    latency_mean_s: float | None
    latency_p50_s: float | None
    latency_p95_s: float | None
    ttft_mean_s: float | None
    ttft_p50_s: float | None
    ttfa_mean_s: float | None
    ttfa_p50_s: float | None
    first_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LevelSummary:
        """A row from a JSON file (ours or a baseline's); missing optional numbers become None."""
        fields = cls.__dataclass_fields__
        unknown = set(data) - set(fields)
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}")
        required = {"label", "concurrency", "requests_per_s", "output_tokens_per_s"}
        missing = required - set(data)
        if missing:
            raise ValueError(f"missing fields {sorted(missing)}")

        def number(name: str) -> float | None:
            value = data.get(name)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number, got {value!r}")
            return float(value)

        values: dict[str, Any] = {
            name: number(name) for name in fields if name.endswith("_s") or name.endswith("_per_s")
        }
        values.update(
            label=str(data["label"]),
            concurrency=int(data["concurrency"]),
            requests=int(data.get("requests") or 0),
            failed=int(data.get("failed") or 0),
            wall_s=float(data.get("wall_s") or 0.0),
            first_error=data.get("first_error"),
        )
        return cls(**values)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _p(values: list[float], q: float) -> float | None:
    return percentile(values, q) if values else None


def summarize(
    samples: list[RequestSample], *, concurrency: int, wall_s: float, label: str = "omni"
) -> LevelSummary:
    """Throughput over the level's wall time; latencies over successful requests only."""
    ok = [s for s in samples if s.ok]
    latencies = [s.latency_s for s in ok]
    ttfts = [s.ttft_s for s in ok if s.ttft_s is not None]
    ttfas = [s.ttfa_s for s in ok if s.ttfa_s is not None]
    tokens = sum(s.output_tokens for s in ok)
    errors = [s.error for s in samples if not s.ok and s.error]
    return LevelSummary(
        label=label,
        concurrency=concurrency,
        requests=len(samples),
        failed=len(samples) - len(ok),
        wall_s=wall_s,
        requests_per_s=len(ok) / wall_s if wall_s > 0 else 0.0,
        output_tokens_per_s=tokens / wall_s if wall_s > 0 else 0.0,
        latency_mean_s=_mean(latencies),
        latency_p50_s=_p(latencies, 50),
        latency_p95_s=_p(latencies, 95),
        ttft_mean_s=_mean(ttfts),
        ttft_p50_s=_p(ttfts, 50),
        ttfa_mean_s=_mean(ttfas),
        ttfa_p50_s=_p(ttfas, 50),
        first_error=errors[0] if errors else None,
    )
