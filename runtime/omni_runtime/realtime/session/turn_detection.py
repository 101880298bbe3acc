"""Server VAD as a pure state machine: per-frame speech probabilities in, turn events out.

The speech model (silero, `session/vad.py`) scores 32 ms frames; this module decides what those
scores mean for a conversation, with the OpenAI server-VAD parameters: speech starts at the first
frame at or above ``threshold``; it stops after ``silence_duration_ms`` of frames below the
hysteresis threshold (``threshold - 0.15``, as silero's own iterator does, so a voice that wavers
around the threshold is not cut into pieces). Times are milliseconds on the session's audio
timeline (all audio appended since the session began), which is what the protocol reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

FRAME_SAMPLES = 512  # silero at 16 kHz
FRAME_RATE = 16_000
FRAME_MS = FRAME_SAMPLES * 1000 / FRAME_RATE  # 32 ms
HYSTERESIS = 0.15


class SpeechScorer(Protocol):
    """Speech probability per 512-sample 16 kHz frame; keeps its own recurrent state per stream."""

    async def score(self, frames: np.ndarray) -> np.ndarray: ...  # [n, 512] float32 -> [n]

    def reset(self) -> None: ...


@dataclass(frozen=True)
class SpeechStarted:
    audio_start_ms: int


@dataclass(frozen=True)
class SpeechStopped:
    audio_start_ms: int
    audio_end_ms: int  # includes the silence that confirmed the stop, as the OpenAI API reports it
    speech_end_ms: int  # end of the last speech frame


@dataclass(frozen=True)
class SpeechLong:
    """The current speech has lasted ``long_speech_ms`` (emitted once per utterance)."""

    audio_start_ms: int
    speech_ms: int


TurnEvent = SpeechStarted | SpeechStopped | SpeechLong


class TurnDetector:
    def __init__(
        self, *, threshold: float, silence_duration_ms: int, long_speech_ms: int | None = None
    ) -> None:
        self.threshold = threshold
        self.silence_duration_ms = silence_duration_ms
        self.long_speech_ms = long_speech_ms
        self._long_sent = False
        self.frames_seen = 0
        self.in_speech = False
        self.speech_start_ms = 0
        self._last_speech_end_ms = 0.0
        self._silence_ms = 0.0

    @property
    def now_ms(self) -> float:
        return self.frames_seen * FRAME_MS

    def speech_ms(self) -> float:
        """How long the current speech has lasted (0 outside speech)."""
        return self._last_speech_end_ms - self.speech_start_ms if self.in_speech else 0.0

    def feed(self, prob: float) -> TurnEvent | None:
        start_ms = self.now_ms
        self.frames_seen += 1
        end_ms = self.now_ms
        if not self.in_speech:
            if prob >= self.threshold:
                self.in_speech = True
                self.speech_start_ms = int(start_ms)
                self._last_speech_end_ms = end_ms
                self._silence_ms = 0.0
                self._long_sent = False
                return SpeechStarted(audio_start_ms=int(start_ms))
            return None
        if prob >= self.threshold - HYSTERESIS:
            self._last_speech_end_ms = end_ms
            self._silence_ms = 0.0
            if (
                self.long_speech_ms is not None
                and not self._long_sent
                and self.speech_ms() >= self.long_speech_ms
            ):
                self._long_sent = True
                return SpeechLong(audio_start_ms=self.speech_start_ms, speech_ms=int(self.speech_ms()))
            return None
        self._silence_ms += FRAME_MS
        if self._silence_ms >= self.silence_duration_ms:
            self.in_speech = False
            return SpeechStopped(
                audio_start_ms=self.speech_start_ms,
                audio_end_ms=int(end_ms),
                speech_end_ms=int(self._last_speech_end_ms),
            )
        return None


class Listener:
    """Server VAD over the session's 16 kHz timeline: samples in, turn events (absolute ms) out."""

    def __init__(self, *, scorer: SpeechScorer, detector: TurnDetector, origin_ms: int) -> None:
        self.scorer = scorer
        self.detector = detector
        self.origin_ms = origin_ms  # session time at which this listener's first frame begins
        self._pending = np.zeros(0, dtype=np.float32)

    @property
    def in_speech(self) -> bool:
        return self.detector.in_speech

    def reset_pending(self) -> None:
        self._pending = np.zeros(0, dtype=np.float32)

    async def feed(self, samples: np.ndarray) -> list[TurnEvent]:
        pending = np.concatenate([self._pending, samples]) if self._pending.size else samples
        count = pending.size // FRAME_SAMPLES
        self._pending = pending[count * FRAME_SAMPLES :]
        if count == 0:
            return []
        probs = await self.scorer.score(pending[: count * FRAME_SAMPLES].reshape(count, FRAME_SAMPLES))
        events: list[TurnEvent] = []
        for prob in probs:
            turn = self.detector.feed(float(prob))
            if isinstance(turn, SpeechStarted):
                events.append(SpeechStarted(audio_start_ms=self.origin_ms + turn.audio_start_ms))
            elif isinstance(turn, SpeechStopped):
                events.append(
                    SpeechStopped(
                        audio_start_ms=self.origin_ms + turn.audio_start_ms,
                        audio_end_ms=self.origin_ms + turn.audio_end_ms,
                        speech_end_ms=self.origin_ms + turn.speech_end_ms,
                    )
                )
            elif isinstance(turn, SpeechLong):
                events.append(
                    SpeechLong(audio_start_ms=self.origin_ms + turn.audio_start_ms, speech_ms=turn.speech_ms)
                )
        return events
