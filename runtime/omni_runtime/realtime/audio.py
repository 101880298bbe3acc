"""PCM16 in and out of realtime sockets, and a streaming resampler (numpy only).

Clients send base64 PCM16 mono at 16 or 24 kHz in pieces of any length; the model and the VAD want
16 kHz, and the talker's audio (24 kHz for Qwen) goes back at the rate the client chose. Resampling
each piece on its own would put edge artifacts at every piece boundary, so `StreamingResampler`
keeps just enough context on both sides that its output equals resampling the whole stream at
once (the same polyphase filter as `omni_runtime.media.resample`).
"""

from __future__ import annotations

import base64
import binascii
from math import ceil, floor, gcd

import numpy as np

from omni_runtime.media.audio import to_pcm16
from omni_runtime.media.resample import _ZERO_CROSSINGS, resample
from omni_runtime.realtime.errors import INVALID_AUDIO, INVALID_BASE64, ProtocolError

SUPPORTED_RATES = (16_000, 24_000)
MODEL_RATE = 16_000  # audio encoder and silero VAD


def decode_b64(text: object, *, param: str, max_bytes: int) -> bytes:
    """Strict base64 to bytes; the size is checked from the text length before decoding."""
    if not isinstance(text, str):
        raise ProtocolError(f"{param} must be a base64 string", code=INVALID_BASE64, param=param)
    if len(text) * 3 // 4 > max_bytes:
        raise ProtocolError(
            f"{param} holds about {len(text) * 3 // 4} bytes; at most {max_bytes} are accepted in one event "
            "(send the audio in smaller pieces)",
            code="event_too_large",
            param=param,
        )
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProtocolError(f"{param} is not valid base64", code=INVALID_BASE64, param=param) from exc


def pcm16_to_float(data: bytes, *, param: str) -> np.ndarray:
    if len(data) % 2:
        raise ProtocolError(
            f"{param} has an odd number of bytes ({len(data)}); PCM16 audio has 2 bytes per sample",
            code=INVALID_AUDIO,
            param=param,
        )
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def float_to_b64_pcm16(pcm: np.ndarray) -> str:
    return base64.b64encode(to_pcm16(pcm)).decode("ascii")


def ms_of(samples: int, rate: int) -> int:
    return int(samples * 1000 // rate)


def samples_of(ms: float, rate: int) -> int:
    return round(ms * rate / 1000)


class StreamingResampler:
    """Resample a stream piece by piece; the concatenated output equals one-shot `resample`.

    Output sample n is centred on input position n*down/up and needs the inputs within
    ``half_width`` of it. A piece is resampled together with a left context that starts on a
    multiple of ``down`` (so output indices stay integers) and outputs are released only when
    their right context has arrived; `flush` releases the rest with the zero padding the one-shot
    resampler uses at the end.
    """

    def __init__(self, *, orig_sr: int, target_sr: int) -> None:
        self.orig_sr = orig_sr
        self.target_sr = target_sr
        g = gcd(orig_sr, target_sr)
        self.up, self.down = target_sr // g, orig_sr // g
        self.half_width = ceil(_ZERO_CROSSINGS * max(self.up, self.down) / self.up) + 1
        self._buf = np.zeros(0, dtype=np.float32)
        self._base = 0  # absolute input index of _buf[0], a multiple of down
        self._emitted = 0  # absolute output samples released so far

    @property
    def identity(self) -> bool:
        return self.up == self.down

    def push(self, pcm: np.ndarray) -> np.ndarray:
        pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if self.identity:
            self._emitted += pcm.size
            return pcm
        self._buf = np.concatenate([self._buf, pcm])
        total_in = self._base + self._buf.size
        # Outputs whose whole filter support lies inside the input received so far.
        ready = max(self._emitted, floor((total_in - 1 - self.half_width) * self.up / self.down) + 1)
        out = self._compute(ready)
        # Keep the inputs later outputs still need, starting on a multiple of down.
        need_from = floor(ready * self.down / self.up) - self.half_width
        keep_from = max(self._base, (max(need_from, 0) // self.down) * self.down)
        self._buf = self._buf[keep_from - self._base :]
        self._base = keep_from
        return out

    def flush(self) -> np.ndarray:
        if self.identity:
            return np.zeros(0, dtype=np.float32)
        total_in = self._base + self._buf.size
        out = self._compute(ceil(total_in * self.up / self.down))
        self._buf = np.zeros(0, dtype=np.float32)
        self._base = ((total_in + self.down - 1) // self.down) * self.down
        return out

    def _compute(self, ready: int) -> np.ndarray:
        if ready <= self._emitted or self._buf.size == 0:
            return np.zeros(0, dtype=np.float32)
        y = resample(self._buf, orig_sr=self.orig_sr, target_sr=self.target_sr)
        offset = self._base * self.up // self.down
        out = y[self._emitted - offset : ready - offset]
        self._emitted += out.size
        return out.astype(np.float32)
