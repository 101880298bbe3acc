"""Helpers for realtime unit tests: an energy VAD, test signals, a driver for sessions.

The state machine is driven exactly as the socket drives it (``handle_text`` with JSON text) and
its output is read from the outbox as the sender would send it, stale deltas dropped.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np

from omni_runtime.realtime.session.session import RealtimeSession


class EnergyScorer:
    """A deterministic speech scorer: a frame is speech when its RMS passes 0.05."""

    def __init__(self) -> None:
        self.frames = 0

    async def score(self, frames: np.ndarray) -> np.ndarray:
        self.frames += frames.shape[0]
        rms = np.sqrt((frames.astype(np.float64) ** 2).mean(axis=1))
        return (rms > 0.05).astype(np.float32)

    def reset(self) -> None:
        return None


def tone(ms: int, *, rate: int = 24_000, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(rate * ms // 1000) / rate
    return (amplitude * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def silence(ms: int, *, rate: int = 24_000) -> np.ndarray:
    return np.zeros(rate * ms // 1000, dtype=np.float32)


def b64_pcm16(pcm: np.ndarray) -> str:
    return base64.b64encode((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes()).decode()


class Driver:
    """Sends client events to a session and collects what its socket would receive."""

    def __init__(self, session: RealtimeSession) -> None:
        self.session = session
        self.events: list[dict[str, Any]] = []
        self.cursor = 0  # events before it were returned by `until` or skipped past

    async def send(self, event: dict[str, Any] | str) -> None:
        await self.session.handle_text(event if isinstance(event, str) else json.dumps(event))

    def drain(self) -> list[dict[str, Any]]:
        """Everything queued so far, in order, as the sender would send it."""
        fresh = [json.loads(text) for text in self.session.outbox.ready_texts()]
        self.events.extend(fresh)
        return fresh

    async def until(self, event_type: str, *, timeout: float = 5.0) -> dict[str, Any]:
        """Wait for the next event of ``event_type`` after the cursor; moves the cursor past it."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            self.drain()
            for index in range(self.cursor, len(self.events)):
                if self.events[index]["type"] == event_type:
                    self.cursor = index + 1
                    return self.events[index]
            if asyncio.get_running_loop().time() > deadline:
                got = [e["type"] for e in self.events[self.cursor :]]
                raise AssertionError(f"no {event_type} within {timeout} s; got {got}")
            await asyncio.sleep(0.005)

    def types(self) -> list[str]:
        self.drain()
        return [event["type"] for event in self.events]

    async def append(self, pcm: np.ndarray, *, piece_ms: int = 100, rate: int = 24_000) -> None:
        step = rate * piece_ms // 1000
        for start in range(0, pcm.size, step):
            await self.send(
                {"type": "input_audio_buffer.append", "audio": b64_pcm16(pcm[start : start + step])}
            )
