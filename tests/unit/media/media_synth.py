"""Media made in the test: tones, PNGs and MP4s written with soundfile, Pillow and PyAV."""

from __future__ import annotations

import io

import av
import numpy as np
import soundfile as sf
from PIL import Image


def make_tone(*, freq: float, sample_rate: int, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(round(sample_rate * seconds)) / sample_rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def peak_frequency(pcm: np.ndarray, sample_rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(pcm.size)))
    return float(np.fft.rfftfreq(pcm.size, 1 / sample_rate)[spectrum.argmax()])


def encode_audio(pcm: np.ndarray, *, sample_rate: int, fmt: str, subtype: str | None = None) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, pcm, sample_rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def encode_mp4(*, frames: int, fps: int, width: int, height: int, with_audio: bool = False) -> bytes:
    """An H.264 MP4 whose frame i is a flat grey of level (i * 20) % 256, optionally with an AAC tone."""
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264" if "libx264" in av.codecs_available else "mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        audio_stream = container.add_stream("aac", rate=16000) if with_audio else None
        for i in range(frames):
            pixels = np.full((height, width, 3), (i * 20) % 256, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
        if audio_stream is not None:
            tone = make_tone(freq=440, sample_rate=16000, seconds=frames / fps)
            frame = av.AudioFrame.from_ndarray(tone[None, :], format="fltp", layout="mono")
            frame.sample_rate = 16000
            for packet in audio_stream.encode(frame):
                container.mux(packet)
            for packet in audio_stream.encode(None):
                container.mux(packet)
    return buffer.getvalue()


def encode_png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()
