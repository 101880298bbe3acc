"""What a listener hears: playback of one stream's audio timeline, and the per-level speech numbers.

A speech reply reaches the client as audio chunks, each with an arrival time (seconds after the
request was sent) and a duration (seconds of audio). The listener starts playing at the first
chunk's arrival and plays the chunks back to back. Whenever the next chunk has not arrived when
the previous one finishes playing, playback stalls (an underrun) until it arrives. So:

- time to first audio (TTFA) = the first chunk's arrival;
- stall = the sum of those waits; a stream with no stall stayed real time;
- real-time factor (RTF) = the time the reply took to arrive (last chunk's arrival) / its audio
  seconds; below 1 the server generates faster than the audio plays.

For a level (all streams of one concurrency or one arrival rate), the audio seconds all streams
received divided by the level's wall time is the audio-seconds per second the worker sustained:
N streams in real time need at least N.

Pure arithmetic, no I/O: the bench and the HF baseline both feed it timelines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from omni_runtime.bench.quantile import percentile

# A stall shorter than this is float noise (sums of chunk durations), not a gap a listener hears.
EPSILON_S = 1e-9


@dataclass(frozen=True)
class Chunk:
    arrival_s: float  # seconds after the request was sent
    duration_s: float  # seconds of audio in the chunk


@dataclass(frozen=True)
class Playback:
    """One stream played from its first audio on."""

    ttfa_s: float
    audio_s: float
    stall_s: float  # total underrun: time the listener waited for audio after playback started
    stalls: int  # how many separate underruns
    finish_s: float  # when the last sample has been played (from the request's start)
    rtf: float  # last arrival / audio seconds
    # The closest call: the least audio still queued at the listener when a later chunk arrived
    # (negative: the longest single wait). None for a one-chunk stream.
    min_slack_s: float | None = None

    @property
    def real_time(self) -> bool:
        return self.stall_s <= EPSILON_S


def play(timeline: Sequence[Chunk]) -> Playback | None:
    """Play a timeline in arrival order; None for a stream with no audio."""
    chunks = _audible(timeline)
    if not chunks:
        return None
    heard, finish = _walk(chunks)
    waits = [wait for _, wait in heard if wait > 0]
    audio = sum(c.duration_s for c in chunks)
    return Playback(
        ttfa_s=chunks[0].arrival_s,
        audio_s=audio,
        stall_s=sum(waits),
        stalls=len(waits),
        finish_s=finish,
        rtf=chunks[-1].arrival_s / audio,
        min_slack_s=min((slack for slack, _ in heard), default=None),
    )


def chunk_waits(timeline: Sequence[Chunk]) -> list[tuple[float, float]]:
    """For each chunk after the first, in arrival order: (slack, wait). Slack is the audio still
    queued at the listener when it arrived (negative: playback had run dry that long before);
    wait is the stall it ended (0 if it came in time, or later by no more than ``EPSILON_S``)."""
    chunks = _audible(timeline)
    return _walk(chunks)[0] if chunks else []


def _audible(timeline: Sequence[Chunk]) -> list[Chunk]:
    chunks = sorted((c for c in timeline if c.duration_s > 0), key=lambda c: c.arrival_s)
    if any(c.arrival_s < 0 for c in chunks):
        raise ValueError("chunk arrivals are seconds after the request was sent; got a negative one")
    return chunks


def _walk(chunks: Sequence[Chunk]) -> tuple[list[tuple[float, float]], float]:
    """The play head over chunks in arrival order: each later chunk's (slack, wait), and when the
    last sample has been played. Playback starts at the first arrival and waits whenever audio is late."""
    clock = chunks[0].arrival_s  # when the audio queued so far runs out
    heard = []
    for index, chunk in enumerate(chunks):
        if index > 0:
            late = chunk.arrival_s > clock + EPSILON_S
            heard.append((clock - chunk.arrival_s, chunk.arrival_s - clock if late else 0.0))
        clock = max(clock, chunk.arrival_s) + chunk.duration_s
    return heard, clock


@dataclass(frozen=True)
class SpeechLevel:
    """The speech numbers of one level; None where no stream had audio."""

    audio_streams: int  # streams that received audio
    realtime_streams: int  # of those, streams that never stalled
    ttfa_p50_s: float | None
    ttfa_p95_s: float | None
    ttfa_p99_s: float | None
    stall_mean_s: float | None  # underrun seconds per stream
    stall_p95_s: float | None
    stall_max_s: float | None
    rtf_p50: float | None
    rtf_max: float | None
    audio_s: float
    audio_s_per_s: float  # audio seconds received per wall second of the level
    # Audio seconds per stream, shortest and median: replies asked for a fixed length that come
    # out shorter (a talker that drew its end code early) show as a minimum below the median.
    stream_audio_min_s: float | None = None
    stream_audio_p50_s: float | None = None
    # The closest call of the level: the least audio any stream still had queued when a later chunk
    # arrived (``Playback.min_slack_s``; negative: the longest single wait). A level with every
    # stream real time shows here how near it came to a stall.
    closest_s: float | None = None

    def row_fields(self) -> dict[str, float | int | None]:
        """The fields a bench row (`LevelSummary`) carries; audio_s stays out (it has no column)."""
        fields = asdict(self)
        del fields["audio_s"], fields["ttfa_p50_s"]  # the row has its own ttfa_p50_s, over all requests
        return fields


def summarize_speech(timelines: Sequence[Sequence[Chunk]], *, wall_s: float) -> SpeechLevel:
    played = [p for p in (play(t) for t in timelines) if p is not None]
    streams = [p.audio_s for p in played]
    audio = sum(streams)

    def p(values: list[float], q: float) -> float | None:
        return percentile(values, q) if values else None

    ttfas = [x.ttfa_s for x in played]
    stalls = [x.stall_s for x in played]
    rtfs = [x.rtf for x in played]
    return SpeechLevel(
        audio_streams=len(played),
        realtime_streams=sum(1 for x in played if x.real_time),
        ttfa_p50_s=p(ttfas, 50),
        ttfa_p95_s=p(ttfas, 95),
        ttfa_p99_s=p(ttfas, 99),
        stall_mean_s=sum(stalls) / len(stalls) if stalls else None,
        stall_p95_s=p(stalls, 95),
        stall_max_s=max(stalls) if stalls else None,
        rtf_p50=p(rtfs, 50),
        rtf_max=max(rtfs) if rtfs else None,
        audio_s=audio,
        audio_s_per_s=audio / wall_s if wall_s > 0 else 0.0,
        stream_audio_min_s=min(streams, default=None),
        stream_audio_p50_s=p(streams, 50),
        closest_s=min((x.min_slack_s for x in played if x.min_slack_s is not None), default=None),
    )
