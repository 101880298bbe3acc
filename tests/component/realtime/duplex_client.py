"""A full-duplex client written from the published description (vLLM-Omni's duplex lane, MiniCPM-o style).

What it knows of the protocol, and nothing of the server's code:
- it connects to ``/v1/duplex`` (native) or ``/v1/realtime?duplex=1`` and configures the session
  with ``session.update``; model-driven turn taking is ``extra_body.auto_response`` with
  ``extra_body.force_listen_count`` forced-listen units;
- it streams 16 kHz PCM16 with ``input_audio_buffer.append`` while the assistant talks; an append
  may carry ``force_listen`` or ``force_barge_in``;
- output arrives as units: one audio delta (``response.audio.delta``, or the GA
  ``response.output_audio.delta``) followed by one transcript delta (empty when the unit has no
  text). The pair is the playback clock: a bridge plays the audio and shows the text together;
- it reports what it played with ``playback.ack {response_id, played_ms}``; the model's choice to
  keep listening is ``response.listen``, its choice to talk ``response.speak``.
"""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import websockets

AUDIO_DELTAS = ("response.audio.delta", "response.output_audio.delta")
TRANSCRIPT_DELTAS = ("response.audio_transcript.delta", "response.output_audio_transcript.delta")
OUTPUT_RATE = 24_000  # PCM16 mono, the session default


def pcm16(pcm: np.ndarray) -> str:
    return base64.b64encode((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes()).decode()


@dataclass
class Unit:
    response_id: str
    audio_ms: float
    text: str


@dataclass
class DuplexClient:
    ws: Any
    events: list[dict[str, Any]] = field(default_factory=list)
    cursor: int = 0
    reader: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, url: str) -> DuplexClient:
        client = cls(await websockets.connect(url, max_size=None))
        client.reader = asyncio.create_task(client._read())
        return client

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                self.events.append(json.loads(message))
        except websockets.ConnectionClosed:
            return

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    async def configure(self, **session: Any) -> dict[str, Any]:
        """Input 16 kHz PCM16; returns the ``session.updated`` (or raises on an ``error``)."""
        body = {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}, **session}
        await self.send({"type": "session.update", "session": body})
        reply = await self.next_of("session.updated", "error")
        if reply["type"] == "error":
            raise AssertionError(f"session.update refused: {reply['error']}")
        return reply

    async def stream(self, pcm16k: np.ndarray, *, piece_ms: int = 100, **hints: Any) -> None:
        step = 16 * piece_ms
        for start in range(0, pcm16k.size, step):
            await self.send(
                {"type": "input_audio_buffer.append", "audio": pcm16(pcm16k[start : start + step]), **hints}
            )

    async def ack(self, response_id: str, played_ms: int) -> None:
        await self.send({"type": "playback.ack", "response_id": response_id, "played_ms": played_ms})

    async def next_of(self, *types: str, timeout: float = 120.0, **match: Any) -> dict[str, Any]:
        """The next event of one of ``types`` (with fields equal to ``match``) after the cursor."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            for index in range(self.cursor, len(self.events)):
                event = self.events[index]
                if event["type"] in types and all(event.get(k) == v for k, v in match.items()):
                    self.cursor = index + 1
                    return event
            if self.reader is not None and self.reader.done():
                raise AssertionError(
                    f"socket closed before {types}; last: {[e['type'] for e in self.events[-5:]]}"
                )
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(
                    f"no {types} in {timeout} s; got {[e['type'] for e in self.events[self.cursor :]][:40]}"
                )
            await asyncio.sleep(0.01)

    def units(self, response_id: str) -> list[Unit]:
        """The response's output as the bridge clocks it: each audio delta with the transcript delta after it."""
        units: list[Unit] = []
        mine = [e for e in self.events if e.get("response_id") == response_id]
        for index, event in enumerate(mine):
            if event["type"] in AUDIO_DELTAS:
                after = mine[index + 1] if index + 1 < len(mine) else {}
                if after.get("type") not in TRANSCRIPT_DELTAS:
                    raise AssertionError(
                        f"audio delta {event['event_id']} is not followed by its transcript delta"
                    )
                samples = len(base64.b64decode(event["delta"])) // 2
                units.append(Unit(response_id, samples * 1000 / OUTPUT_RATE, after["delta"]))
        return units

    def audio_ms(self, response_id: str) -> float:
        """Audio received for a response (the playback clock's total, pairs or not)."""
        deltas = [e for e in self.events if e["type"] in AUDIO_DELTAS and e.get("response_id") == response_id]
        return sum(len(base64.b64decode(e["delta"])) // 2 for e in deltas) * 1000 / OUTPUT_RATE

    def of_type(self, *types: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] in types]

    async def close(self) -> None:
        await self.ws.close()
        if self.reader is not None:
            await self.reader
