"""A streaming video client written from vLLM-Omni 0.30's description of /v1/video/chat/stream.

What the release documents (serving_video_stream.py, REFERENCE.md "Streaming video input"): the
client sends ``session.config`` first, then ``video.frame`` {data: base64 JPEG/PNG},
``audio.chunk`` {data: base64 PCM16 16 kHz mono}, ``video.query`` {text} and ``video.done``; the
server answers ``response.start``, ``response.text.delta`` {delta}, ``response.text.done`` {text},
``response.output_audio.delta`` {data: base64 WAV, format: "wav"} (``response.audio.delta`` in
older descriptions), ``response.output_audio.done``, ``session.done`` and ``error`` {message}.
Nothing here knows our server's code: responses are told apart by ``response.start`` alone.
"""

from __future__ import annotations

import base64
import io
import wave
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image, ImageDraw
from rt_client import RawRealtime


def jpeg_frame(step: int, *, size: tuple[int, int] = (160, 120)) -> bytes:
    """A camera-like JPEG: a sky, a ground and a ball that moves with ``step``."""
    image = Image.new("RGB", size, (110, 170, 230))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, size[1] * 2 // 3, size[0], size[1]), fill=(60, 140, 60))
    x = 10 + step * 25
    draw.ellipse((x, 40, x + 30, 70), fill=(230, 40, 40))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


@dataclass
class Response:
    """The events from one ``response.start`` to the next (or the end)."""

    events: list[dict[str, Any]] = field(default_factory=list)

    def of(self, *types: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] in types]

    @property
    def text(self) -> str:
        return "".join(e["delta"] for e in self.of("response.text.delta"))

    def wavs(self, event_type: str = "response.output_audio.delta") -> list[tuple[int, np.ndarray]]:
        """Each audio delta decoded as the WAV file it must be: (sample rate, int16 samples)."""
        out = []
        for event in self.of(event_type):
            assert event["format"] == "wav", event["format"]
            with wave.open(io.BytesIO(base64.b64decode(event["data"]))) as wav:
                assert (wav.getnchannels(), wav.getsampwidth()) == (1, 2)
                out.append((wav.getframerate(), np.frombuffer(wav.readframes(wav.getnframes()), "<i2")))
        return out


class VideoStreamClient(RawRealtime):
    """The socket transport of `rt_client`; the events are the streaming video protocol's."""

    async def config(self, **fields: Any) -> None:
        await self.send({"type": "session.config", **fields})

    async def frame(self, data: bytes) -> None:
        await self.send({"type": "video.frame", "data": base64.b64encode(data).decode()})

    async def audio(self, pcm: bytes) -> None:
        await self.send({"type": "audio.chunk", "data": base64.b64encode(pcm).decode()})

    async def query(self, text: str) -> None:
        await self.send({"type": "video.query", "text": text})

    async def collect(
        self, event_type: str, *, count: int = 1, timeout: float = 120.0
    ) -> list[dict[str, Any]]:
        """Wait until ``count`` events of ``event_type`` have arrived in all; returns them."""
        self.cursor = 0
        for _ in range(count):
            await self.until(event_type, timeout=timeout)
        return [e for e in self.events if e["type"] == event_type]

    async def finish(self, *, timeout: float = 120.0) -> None:
        """``video.done``, then wait for ``session.done`` and the close."""
        await self.send({"type": "video.done"})
        await self.collect("session.done", timeout=timeout)
        await self.close()

    def errors(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == "error"]

    def responses(self) -> list[Response]:
        responses: list[Response] = []
        for event in self.events:
            if event["type"] == "response.start":
                responses.append(Response())
            if responses and event["type"].startswith("response."):
                responses[-1].events.append(event)
        return responses
