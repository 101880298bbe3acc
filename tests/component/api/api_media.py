"""Media made in the test for HTTP requests: a PNG, tone and speech WAVs, an MP4, as data: URIs."""

from __future__ import annotations

import base64
import io
import shutil
import subprocess

import av
import numpy as np
import soundfile as sf
from PIL import Image


def data_uri(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def png_bytes(width: int = 48, height: int = 32) -> bytes:
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    pixels[:, : width // 2] = (220, 40, 40)
    pixels[:, width // 2 :] = (40, 40, 220)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def tone_wav(*, freq: float = 440.0, seconds: float = 1.0, sample_rate: int = 44100) -> bytes:
    t = np.arange(int(sample_rate * seconds)) / sample_rate
    buffer = io.BytesIO()
    sf.write(buffer, (0.4 * np.sin(2 * np.pi * freq * t)).astype(np.float32), sample_rate, format="WAV")
    return buffer.getvalue()


def espeak_wav(text: str) -> bytes | None:
    """Real speech from espeak-ng (22.05 kHz WAV), or None where it is not installed."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        return None
    return subprocess.run([exe, "--stdout", text], check=True, capture_output=True, timeout=30).stdout


def mp4_bytes(
    *, frames: int = 8, fps: int = 4, width: int = 64, height: int = 48, tone_hz: float | None = None
) -> bytes:
    """An MP4 of grey frames; with ``tone_hz``, an AAC audio track of that tone over the whole clip."""
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264" if "libx264" in av.codecs_available else "mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        audio = container.add_stream("aac", rate=16000) if tone_hz is not None else None
        for i in range(frames):
            pixels = np.full((height, width, 3), (i * 30) % 256, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
        if audio is not None and tone_hz is not None:
            t = np.arange(int(16000 * frames / fps)) / 16000
            wave = (0.4 * np.sin(2 * np.pi * tone_hz * t)).astype(np.float32)
            frame = av.AudioFrame.from_ndarray(wave[None, :], format="fltp", layout="mono")
            frame.sample_rate = 16000
            for packet in [*audio.encode(frame), *audio.encode(None)]:
                container.mux(packet)
    return buffer.getvalue()
