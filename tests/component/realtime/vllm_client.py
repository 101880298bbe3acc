"""A client of vLLM's session-based realtime protocol, written from the released server's description.

vLLM's realtime connection (``vllm.entrypoints.speech_to_text.realtime``) and vLLM-Omni's subclass
describe the flow: connect, read ``session.created`` (``id``, ``created``), send ``session.update``
with ``model``, send ``input_audio_buffer.commit`` to start, stream ``input_audio_buffer.append``
events (base64 PCM16, mono, 16 kHz), end with ``input_audio_buffer.commit`` ``final: true``; read
``transcription.delta`` events until ``transcription.done`` (``text``, ``usage`` with
``prompt_tokens``, ``completion_tokens``, ``total_tokens``). vLLM-Omni adds
``response.output_audio.delta`` (``audio`` base64 PCM16, ``format``, ``sample_rate_hz``) and a closing
``response.output_audio.done`` (``has_audio``). Errors are ``{"type": "error", "error": str, "code": str}``.
Nothing here comes from this repository's server code.
"""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import websockets

RATE = 16_000


def to_pcm16_b64(audio: np.ndarray) -> str:
    return base64.b64encode((np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes()).decode("ascii")


@dataclass
class Transcription:
    deltas: list[str] = field(default_factory=list)
    text: str = ""
    usage: dict[str, Any] = field(default_factory=dict)
    audio: bytes = b""
    sample_rates: set[int] = field(default_factory=set)
    has_audio: bool | None = None


class VllmRealtimeClient:
    def __init__(self, ws: websockets.ClientConnection, created: dict[str, Any]) -> None:
        self.ws = ws
        self.created = created
        self.errors: list[dict[str, Any]] = []
        self.other: list[dict[str, Any]] = []  # events of a type this client does not know

    @property
    def session_id(self) -> str:
        return self.created["id"]

    @classmethod
    async def connect(cls, url: str, *, timeout: float = 60) -> VllmRealtimeClient:
        ws = await websockets.connect(url, max_size=None)
        created = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        if created.get("type") != "session.created":
            await ws.close()
            raise AssertionError(f"expected session.created first, got {created}")
        return cls(ws, created)

    async def send(self, event: dict[str, Any] | str) -> None:
        await self.ws.send(event if isinstance(event, str) else json.dumps(event))

    async def update(self, model: str, **fields: Any) -> None:
        await self.send({"type": "session.update", "model": model, **fields})

    async def commit(self, *, final: bool = False) -> None:
        await self.send({"type": "input_audio_buffer.commit", "final": final})

    async def append(self, audio: np.ndarray, *, chunk_ms: int = 100) -> None:
        """Stream 16 kHz float audio as PCM16 appends of ``chunk_ms``."""
        step = RATE * chunk_ms // 1000
        for start in range(0, audio.size, step):
            await self.send(
                {"type": "input_audio_buffer.append", "audio": to_pcm16_b64(audio[start : start + step])}
            )

    async def next_event(self, timeout: float) -> dict[str, Any]:
        return json.loads(await asyncio.wait_for(self.ws.recv(), timeout))

    async def next_error(self, *, timeout: float = 30) -> dict[str, Any]:
        while True:
            event = await self.next_event(timeout)
            if event["type"] == "error":
                return event
            self.other.append(event)

    async def transcription(self, *, timeout: float = 240) -> Transcription:
        """Read until ``transcription.done`` and vLLM-Omni's ``response.output_audio.done``."""
        result = Transcription()
        done = False
        while True:
            event = await self.next_event(timeout)
            kind = event["type"]
            if kind == "transcription.delta":
                result.deltas.append(event["delta"])
            elif kind == "transcription.done":
                result.text, result.usage = event["text"], event.get("usage") or {}
                done = True
            elif kind == "response.output_audio.delta":
                assert event["format"] == "pcm16"
                result.audio += base64.b64decode(event["audio"])
                result.sample_rates.add(event["sample_rate_hz"])
            elif kind == "response.output_audio.done":
                result.has_audio = event["has_audio"]
                if done:
                    return result
            elif kind == "error":
                self.errors.append(event)
            else:
                self.other.append(event)

    async def close(self) -> None:
        await self.ws.close()
