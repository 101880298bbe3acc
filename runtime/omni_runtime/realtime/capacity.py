"""Admission by speech capacity: how many speech streams this worker carries at once, and refusals.

A GPU keeps only so many speech streams ahead of playback; one more pushes every live stream below
real time. So a worker holds at most ``max_speech_streams`` speech streams (``omni serve
--max-speech-streams``; 0 means no limit) and refuses the next one instead of degrading all of them:

- a chat completion that asks for audio out holds a slot from admission until its generation ends;
- a /v1/realtime session on a worker that speaks holds one for the session's life (any response of
  the session may speak), as does a /v1/video/chat/stream session.

Text-only requests never take a slot. A refusal is HTTP 429 with OpenAI error JSON (code
``speech_capacity_reached``, the message names the limit and the flag) and ``Retry-After``, or on
a WebSocket an ``error`` event with the same body and a close with 1013 (try again later). Either
way the answer carries the header ``x-omni-capacity: speech``: the router sees it on the response
or on the WebSocket handshake and sends a new session to another worker instead.

The admission decision is pure (`admits`); `SpeechCapacity` counts slots on the event loop (no
locks: acquire and release never await). /metrics shows the limit, the slots in use and the
refusals.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from omni_runtime.contract.workers import CAPACITY_HEADER, CAPACITY_SPEECH
from omni_runtime.realtime.errors import ProtocolError

SPEECH_CAPACITY = "speech_capacity_reached"
RATE_LIMIT = "rate_limit_exceeded"  # the error type: OpenAI clients read 429 as a rate limit
FLAG = "--max-speech-streams"
RETRY_AFTER_S = 1


def admits(*, limit: int, in_use: int) -> bool:
    """Whether one more speech stream fits: a limit of 0 (or less) means no limit."""
    return limit <= 0 or in_use < limit


def refusal_headers() -> dict[str, str]:
    return {"retry-after": str(RETRY_AFTER_S), CAPACITY_HEADER: CAPACITY_SPEECH}


@dataclass
class SpeechSlot:
    """One admitted speech stream; `release` is idempotent, so every exit path may call it."""

    capacity: SpeechCapacity
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.capacity.in_use -= 1


@dataclass
class SpeechCapacity:
    limit: int  # 0: no limit
    in_use: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # refusals by kind (chat, realtime, video)

    def acquire(self, kind: str) -> SpeechSlot | None:
        """A slot, or None (counted as a refusal of `kind`) when the worker is full."""
        if not admits(limit=self.limit, in_use=self.in_use):
            self.refused[kind] = self.refused.get(kind, 0) + 1
            return None
        self.in_use += 1
        return SpeechSlot(self)

    def error(self) -> ProtocolError:
        """The refusal, for error JSON (429) and for an ``error`` event before a 1013 close."""
        return ProtocolError(
            f"this worker is at its limit of {self.limit} concurrent speech streams "
            f"({FLAG} {self.limit}); retry in {RETRY_AFTER_S} s or on another worker, or ask for "
            'text only (modalities: ["text"])',
            code=SPEECH_CAPACITY,
            status=429,
            type=RATE_LIMIT,
        )


class SpeechCapacityCollector(Collector):
    """/metrics: the limit, the slots in use and the refusals by kind, read at scrape time."""

    def __init__(self, capacity: SpeechCapacity) -> None:
        self.capacity = capacity

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield GaugeMetricFamily(
            "omni_speech_streams_limit",
            f"Concurrent speech streams this worker admits ({FLAG}; 0: no limit).",
            value=self.capacity.limit,
        )
        yield GaugeMetricFamily(
            "omni_speech_streams_in_use",
            "Speech streams admitted now (chat completions with audio out, speaking sessions).",
            value=self.capacity.in_use,
        )
        refused = CounterMetricFamily(
            "omni_speech_streams_refused",
            "New speech requests or sessions refused at the speech stream limit, by kind.",
            labels=["kind"],
        )
        for kind, count in sorted(self.capacity.refused.items()):
            refused.add_metric([kind], count)
        yield refused
