"""Audio in and out: decode any common container to 16 kHz mono float32; encode replies as WAV/PCM16.

Decoding tries libsndfile first (WAV, FLAC, OGG/Vorbis/Opus, MP3: exact, fast) and falls back to
PyAV/FFmpeg for everything else (AAC/M4A, WebM, audio tracks of video files). The WAV writer puts
the sample rate the audio actually has in the header: the caller passes the talker's true rate
(24 kHz for Qwen, 44.1 kHz for Ming); nothing here assumes one.
"""

from __future__ import annotations

import io
import struct
from typing import TYPE_CHECKING

import numpy as np
import soundfile as sf

from omni_runtime.media.errors import AUDIO_TOO_LONG, INVALID_MEDIA, MediaError
from omni_runtime.media.limits import MediaLimits
from omni_runtime.media.resample import resample

if TYPE_CHECKING:
    pass  # PyAV loads FFmpeg; imported where a container is opened

ENCODER_SAMPLE_RATE = 16_000  # Whisper-style audio encoders (Qwen2.5-Omni, Qwen3-Omni)


def decode_audio(data: bytes, *, limits: MediaLimits, target_sr: int = ENCODER_SAMPLE_RATE) -> np.ndarray:
    """Decode audio bytes to mono float32 at ``target_sr``; raises MediaError when unreadable or too long."""
    if not data:
        raise MediaError("the audio is empty (0 bytes)", code=INVALID_MEDIA)
    try:
        pcm, sample_rate = _decode_soundfile(data, limits=limits)
    except (sf.SoundFileError, RuntimeError, TypeError):
        return decode_audio_track(data, limits=limits, target_sr=target_sr)
    return _resampled(pcm, sample_rate, target_sr)


def decode_audio_track(
    data: bytes, *, limits: MediaLimits, target_sr: int = ENCODER_SAMPLE_RATE
) -> np.ndarray:
    """The first audio track of a container FFmpeg reads (a video's soundtrack, WebM, MP3, M4A ...),
    mono float32 at ``target_sr``."""
    pcm, sample_rate = _decode_pyav(data, limits=limits)
    return _resampled(pcm, sample_rate, target_sr)


def _resampled(pcm: np.ndarray, sample_rate: int, target_sr: int) -> np.ndarray:
    if pcm.size == 0:
        raise MediaError("the audio decodes to no samples", code=INVALID_MEDIA)
    return resample(pcm, orig_sr=sample_rate, target_sr=target_sr)


def _check_duration(frames: int, sample_rate: int, limits: MediaLimits) -> None:
    seconds = frames / sample_rate
    if seconds > limits.max_audio_seconds:
        raise MediaError(
            f"the audio is {seconds:.1f} s long; this worker accepts at most {limits.max_audio_seconds:g} s "
            "(trim it, or raise --max-audio-seconds)",
            code=AUDIO_TOO_LONG,
        )


def _decode_soundfile(data: bytes, *, limits: MediaLimits) -> tuple[np.ndarray, int]:
    with sf.SoundFile(io.BytesIO(data)) as f:
        # The header states the length, so an over-long file is refused before it is decoded.
        if f.frames > 0:
            _check_duration(f.frames, f.samplerate, limits)
        pcm = f.read(dtype="float32", always_2d=True)
        sample_rate = int(f.samplerate)
    _check_duration(pcm.shape[0], sample_rate, limits)
    return pcm.mean(axis=1), sample_rate


def _decode_pyav(data: bytes, *, limits: MediaLimits) -> tuple[np.ndarray, int]:
    import av

    try:
        container = av.open(io.BytesIO(data), mode="r")
    except (av.error.FFmpegError, ValueError) as exc:
        raise MediaError(
            "the audio could not be decoded: not a supported format (send WAV, FLAC, OGG, MP3, M4A or WebM)",
            code=INVALID_MEDIA,
        ) from exc
    with container:
        if not container.streams.audio:
            raise MediaError("the media has no audio track", code=INVALID_MEDIA)
        stream = container.streams.audio[0]
        sample_rate = int(stream.codec_context.sample_rate or stream.rate or 0)
        if sample_rate <= 0:
            raise MediaError("the audio track states no sample rate", code=INVALID_MEDIA)
        # FFmpeg's own resampler only converts the sample format/layout here (to float mono);
        # the rate change is ours, so every path shares one filter.
        converter = av.AudioResampler(format="flt", layout="mono", rate=sample_rate)
        pieces: list[np.ndarray] = []
        total = 0
        try:
            for frame in container.decode(stream):
                for converted in converter.resample(frame):
                    piece = converted.to_ndarray().reshape(-1)
                    pieces.append(piece)
                    total += piece.size
                    _check_duration(total, sample_rate, limits)
            for converted in converter.resample(None):
                pieces.append(converted.to_ndarray().reshape(-1))
        except av.error.FFmpegError as exc:
            raise MediaError(f"the audio stream is corrupt: {exc}", code=INVALID_MEDIA) from exc
    pcm = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
    return pcm.astype(np.float32), sample_rate


def to_pcm16(pcm: np.ndarray) -> bytes:
    """Float audio in [-1, 1] as little-endian signed 16-bit PCM (out-of-range samples are clipped)."""
    clipped = np.clip(np.asarray(pcm, dtype=np.float32).reshape(-1), -1.0, 1.0)
    return (np.round(clipped * 32767.0)).astype("<i2").tobytes()


def wav_header(*, sample_rate: int, num_samples: int, channels: int = 1) -> bytes:
    """A 44-byte RIFF/WAVE header for 16-bit PCM at the given (true) sample rate."""
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    bits = 16
    block_align = channels * bits // 8
    data_bytes = num_samples * block_align
    return (
        b"RIFF"
        + struct.pack("<I", 36 + data_bytes)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block_align, block_align, bits)
        + b"data"
        + struct.pack("<I", data_bytes)
    )


def encode_wav(pcm: np.ndarray, *, sample_rate: int) -> bytes:
    """Mono float audio as a complete WAV file whose header states ``sample_rate``."""
    body = to_pcm16(pcm)
    return wav_header(sample_rate=sample_rate, num_samples=len(body) // 2) + body
