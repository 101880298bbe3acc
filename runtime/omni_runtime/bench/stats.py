"""Benchmark statistics: per-request samples in, one summary per load level out (pure).

A level is a closed loop at one concurrency or an open loop at one arrival rate. Speech levels add
what a listener hears (`omni_runtime.bench.playback`): TTFA percentiles, underrun seconds per
stream, RTF, the streams that stayed real time and the audio seconds delivered per second.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from omni_runtime.bench.playback import Chunk, play, summarize_speech
from omni_runtime.bench.quantile import percentile

__all__ = ["Chunk", "LevelSummary", "RequestSample", "percentile", "request_rows", "summarize"]


@dataclass(frozen=True)
class RequestSample:
    """One request as the client saw it (seconds from sending it)."""

    ok: bool
    latency_s: float
    ttft_s: float | None = None  # first text token
    last_text_s: float | None = None  # last text delta (streaming)
    ttfa_s: float | None = None  # first audio bytes
    output_tokens: int = 0
    text_deltas: int = 0
    audio_chunks: int = 0
    error: str | None = None
    audio: tuple[Chunk, ...] = ()  # the audio timeline: each chunk's arrival and duration
    status: int | None = None  # the HTTP status of a refused request (429: the worker was full)
    sent_s: float | None = None  # when it was sent, seconds after its level began


def request_rows(samples: list[RequestSample], *, level: str) -> list[dict[str, Any]]:
    """One row per request (``omni bench --out``'s requests.jsonl), in the order they were sent:
    when it was sent, what it got and, for speech, what its listener heard. ``level`` names the
    load ("c=16", "2/s"). Seconds to the millisecond's tenth. A speech row also has its audio
    timeline and its closest call (``Playback.min_slack_s``)."""

    def sec(value: float | None) -> float | None:
        return None if value is None else round(value, 4)

    rows = []
    for sample in sorted(samples, key=lambda s: (s.sent_s is None, s.sent_s or 0.0)):
        heard = play(sample.audio) if sample.ok else None
        rows.append(
            {
                "level": level,
                "sent_s": sec(sample.sent_s),
                "ok": sample.ok,
                "status": sample.status,
                "latency_s": sec(sample.latency_s),
                "ttft_s": sec(sample.ttft_s),
                "tpot_s": None if (t := tpot(sample)) is None else round(t, 6),
                "ttfa_s": sec(sample.ttfa_s),
                "audio_s": sec(heard.audio_s) if heard else None,
                "stall_s": sec(heard.stall_s) if heard else None,
                "stalls": heard.stalls if heard else None,
                "min_slack_s": sec(heard.min_slack_s) if heard else None,
                "error": sample.error,
                # each audio chunk's [arrival, seconds]: which window came late, or closest to it
                "chunks": [[sec(c.arrival_s), sec(c.duration_s)] for c in sample.audio] if heard else None,
            }
        )
    return rows


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
    # Streamed text: each request's time per output token after its first (from its first text
    # delta to its last, over its tokens but one), p50 and p95 over the requests; None for
    # non-streaming levels and rows from tools that do not measure it.
    tpot_p50_s: float | None = None
    tpot_p95_s: float | None = None
    refused: int = 0  # failed requests the worker refused with 429 (at its speech stream limit)
    # Open loop: Poisson arrivals per second (concurrency is then the most requests seen in flight).
    rate_per_s: float | None = None
    # Speech (None for text levels, or rows from tools that do not measure them).
    ttfa_p95_s: float | None = None
    ttfa_p99_s: float | None = None
    stall_mean_s: float | None = None  # underrun seconds per stream, playback starting at first audio
    stall_p95_s: float | None = None
    stall_max_s: float | None = None
    rtf_p50: float | None = None
    rtf_max: float | None = None
    audio_streams: int | None = None
    realtime_streams: int | None = None  # streams with no underrun at all
    audio_s_per_s: float | None = None
    stream_audio_min_s: float | None = None  # audio seconds of the shortest stream
    stream_audio_p50_s: float | None = None
    closest_s: float | None = None  # the least audio a stream had left when its next chunk came
    # Closed loop with more than one wave: TTFA p50 of the first ``concurrency`` requests sent (a
    # worker's first burst at this level, all starting together) and of the later ones.
    ttfa_first_wave_p50_s: float | None = None
    ttfa_later_p50_s: float | None = None
    # The worker's /metrics over the level (bench.worker_metrics.worker_report): stage shares,
    # waits, first-audio phases; None where they could not be read.
    worker: dict[str, Any] | None = None

    @property
    def load(self) -> str:
        """The level's load, as the table and the plot show it."""
        return f"{self.rate_per_s:g}/s" if self.rate_per_s is not None else str(self.concurrency)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LevelSummary:
        """A row from a JSON file (ours or a baseline's); missing optional numbers become None."""
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
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

        def count(name: str) -> int | None:
            value = data.get(name)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            return value

        values: dict[str, Any] = {
            name: number(name) for name in names if name.endswith("_s") or name.startswith("rtf_")
        }
        values.update(audio_streams=count("audio_streams"), realtime_streams=count("realtime_streams"))
        values.update(
            label=str(data["label"]),
            concurrency=int(data["concurrency"]),
            requests=int(data.get("requests") or 0),
            failed=int(data.get("failed") or 0),
            refused=int(data.get("refused") or 0),
            wall_s=float(data.get("wall_s") or 0.0),
            first_error=data.get("first_error"),
        )
        return cls(**values)


def tpot(sample: RequestSample) -> float | None:
    """A streamed request's seconds per output token after its first: from its first text delta to
    its last, over its tokens but one; None without two tokens streamed."""
    if sample.ttft_s is None or sample.last_text_s is None or sample.output_tokens < 2:
        return None
    return (sample.last_text_s - sample.ttft_s) / (sample.output_tokens - 1)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _p(values: list[float], q: float) -> float | None:
    return percentile(values, q) if values else None


def summarize(
    samples: list[RequestSample],
    *,
    concurrency: int,
    wall_s: float,
    label: str = "omni",
    rate_per_s: float | None = None,
) -> LevelSummary:
    """Throughput over the level's wall time; latencies over successful requests only. The speech
    fields are filled when any successful request received audio."""
    ok = [s for s in samples if s.ok]
    latencies = [s.latency_s for s in ok]
    ttfts = [s.ttft_s for s in ok if s.ttft_s is not None]
    ttfas = [s.ttfa_s for s in ok if s.ttfa_s is not None]
    tokens = sum(s.output_tokens for s in ok)
    tpots = [t for s in ok if (t := tpot(s)) is not None]
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
        tpot_p50_s=_p(tpots, 50),
        tpot_p95_s=_p(tpots, 95),
        refused=sum(1 for s in samples if not s.ok and s.status == 429),
        rate_per_s=rate_per_s,
        **_speech_fields(ok, wall_s=wall_s),
        **(_wave_fields(samples, concurrency) if rate_per_s is None else {}),
    )


def _wave_fields(samples: list[RequestSample], concurrency: int) -> dict[str, Any]:
    """TTFA p50 of the first wave (the first ``concurrency`` requests sent) and of the rest, when
    both have audio; nothing for one wave or samples without send times."""
    if len(samples) <= concurrency or any(s.sent_s is None for s in samples):
        return {}
    ordered = sorted(samples, key=lambda s: s.sent_s or 0.0)
    first = [s.ttfa_s for s in ordered[:concurrency] if s.ok and s.ttfa_s is not None]
    later = [s.ttfa_s for s in ordered[concurrency:] if s.ok and s.ttfa_s is not None]
    if not first or not later:
        return {}
    return {"ttfa_first_wave_p50_s": _p(first, 50), "ttfa_later_p50_s": _p(later, 50)}


def _speech_fields(ok: list[RequestSample], *, wall_s: float) -> dict[str, Any]:
    if not any(s.audio for s in ok):
        return {}
    return summarize_speech([s.audio for s in ok], wall_s=wall_s).row_fields()
