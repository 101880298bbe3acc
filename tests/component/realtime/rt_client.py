"""A small raw WebSocket client for realtime component tests: send events, collect and await events."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import websockets


def pcm16_b64(pcm: np.ndarray) -> str:
    return base64.b64encode((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes()).decode()


class RawRealtime:
    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.cursor = 0
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, url: str) -> RawRealtime:
        return cls(await websockets.connect(url, max_size=None))

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                self.events.append(json.loads(message))
        except websockets.ConnectionClosed:
            return

    async def send(self, event: dict[str, Any] | str) -> None:
        await self.ws.send(event if isinstance(event, str) else json.dumps(event))

    async def append_audio(self, pcm16k: np.ndarray, *, piece_ms: int = 100) -> None:
        """Send 16 kHz audio (the session must use input rate 16000) in pieces, as fast as possible."""
        step = 16 * piece_ms
        for start in range(0, pcm16k.size, step):
            await self.send(
                {"type": "input_audio_buffer.append", "audio": pcm16_b64(pcm16k[start : start + step])}
            )

    async def until(self, event_type: str, *, timeout: float = 120.0, **match: Any) -> dict[str, Any]:
        """The next event of ``event_type`` (and fields equal to ``match``) after the cursor."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            for index in range(self.cursor, len(self.events)):
                event = self.events[index]
                if event["type"] == event_type and all(event.get(k) == v for k, v in match.items()):
                    self.cursor = index + 1
                    return event
            if self._reader.done():
                raise AssertionError(
                    f"socket closed before {event_type}; last: {[e['type'] for e in self.events[-5:]]}"
                )
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(
                    f"no {event_type} in {timeout} s; got {[e['type'] for e in self.events[self.cursor :]][:40]}"
                )
            await asyncio.sleep(0.01)

    def index_of(self, event: dict[str, Any]) -> int:
        return next(i for i, e in enumerate(self.events) if e is event)

    async def close(self) -> None:
        await self.ws.close()
        await self._reader
