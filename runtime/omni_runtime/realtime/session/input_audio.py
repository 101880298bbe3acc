"""The input audio buffer of a realtime session, on one 16 kHz timeline.

Appended audio (16 or 24 kHz from the client) is resampled to 16 kHz as it arrives and kept until
it is committed or cleared. Positions are absolute sample counts since the session began, so VAD
events, commits and the protocol's ``audio_start_ms``/``audio_end_ms`` all speak of one clock even
after older audio has been dropped.
"""

from __future__ import annotations

import numpy as np

from omni_runtime.realtime.audio import MODEL_RATE, StreamingResampler
from omni_runtime.realtime.errors import BUFFER_FULL, ProtocolError


class InputAudio:
    def __init__(self, *, input_rate: int, max_seconds: float) -> None:
        self.max_samples = int(max_seconds * MODEL_RATE)
        self._chunks: list[np.ndarray] = []
        self.start = 0  # absolute index of the first buffered sample
        self.total = 0  # absolute index one past the last appended sample
        self.input_rate = input_rate
        self._resampler = StreamingResampler(orig_sr=input_rate, target_sr=MODEL_RATE)

    @property
    def size(self) -> int:
        return self.total - self.start

    def ms(self, position: int) -> int:
        return position * 1000 // MODEL_RATE

    def position(self, ms: float) -> int:
        return int(ms * MODEL_RATE // 1000)

    def set_rate(self, rate: int) -> np.ndarray:
        """Switch the client's input rate; returns the old stream's tail (already appended)."""
        if rate == self.input_rate:
            return np.zeros(0, dtype=np.float32)
        tail = self._resampler.flush()
        self._store(tail)
        self.input_rate = rate
        self._resampler = StreamingResampler(orig_sr=rate, target_sr=MODEL_RATE)
        return tail

    def append(self, pcm: np.ndarray) -> np.ndarray:
        """Append client audio (at the input rate); returns the new 16 kHz samples."""
        incoming = pcm.size * MODEL_RATE // self.input_rate
        if self.size + incoming > self.max_samples:
            raise ProtocolError(
                f"the input audio buffer holds {self.size / MODEL_RATE:.1f} s; appending "
                f"{incoming / MODEL_RATE:.1f} s more would pass the limit of {self.max_samples / MODEL_RATE:g} s "
                "(commit or clear the buffer first)",
                code=BUFFER_FULL,
                param="audio",
            )
        new = self._resampler.push(pcm)
        self._store(new)
        return new

    def _store(self, samples: np.ndarray) -> None:
        if samples.size:
            self._chunks.append(samples)
            self.total += samples.size

    def _joined(self) -> np.ndarray:
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
        return self._chunks[0] if self._chunks else np.zeros(0, dtype=np.float32)

    def take(self, *, start: int | None = None, end: int | None = None) -> np.ndarray:
        """Samples in [start, end) (clipped to what is buffered); everything before ``end`` is dropped."""
        begin = self.start if start is None else max(start, self.start)
        stop = self.total if end is None else min(max(end, self.start), self.total)
        data = self._joined()
        out = data[begin - self.start : max(begin, stop) - self.start].copy()
        self.drop_before(stop)
        return out

    def peek(self, *, start: int | None = None) -> np.ndarray:
        """A copy of the samples from ``start`` (clipped to what is buffered) to the end; nothing dropped."""
        begin = self.start if start is None else min(max(start, self.start), self.total)
        return self._joined()[begin - self.start :].copy()

    def drop_before(self, position: int) -> None:
        position = min(max(position, self.start), self.total)
        if position == self.start:
            return
        data = self._joined()
        self._chunks = [data[position - self.start :]]
        self.start = position

    def clear(self) -> None:
        self._chunks = []
        self.start = self.total


class EarlyEncoding:
    """When to encode the speech of the turn being spoken, chunk by chunk, before it is committed.

    The audio encoder encodes each chunk of ``chunk`` samples on its own
    (`Engine.audio_chunk_samples`), so once the turn's audio holds a whole chunk, plus the
    ``margin`` its last feature frames look past it (the STFT window), that chunk's encoding is
    what the committed turn will need. ``begin`` marks where the turn's audio starts (the buffer's
    start, or server VAD's speech start less its prefix padding); ``due`` says, after each append,
    up to which position to encode (None: no new whole chunk). A wrong guess costs only a cache
    miss: reuse is decided by the features' digest (pipeline/encoder_cache.py).
    """

    def __init__(self, chunk: int | None, *, margin: int = 800) -> None:
        self.chunk = chunk
        self.margin = margin
        self.start: int | None = None
        self._chunks = 0

    def begin(self, start: int) -> None:
        self.start, self._chunks = start, 0

    def reset(self) -> None:
        self.start, self._chunks = None, 0

    def due(self, total: int) -> int | None:
        """The end position of the audio to encode now (``start`` to it), if a new chunk completed."""
        if not self.chunk or self.start is None:
            return None
        chunks = max(0, total - self.start - self.margin) // self.chunk
        if chunks <= self._chunks:
            return None
        self._chunks = chunks
        return self.start + chunks * self.chunk + self.margin
