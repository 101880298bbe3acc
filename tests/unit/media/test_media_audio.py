"""Audio decoding to 16 kHz mono from every supported container, its limits, and the WAV writer."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import soundfile as sf
from media_synth import encode_audio, encode_mp4, make_tone, peak_frequency

from omni_runtime.media import MediaError, MediaLimits, decode_audio, encode_wav, to_pcm16, wav_header
from omni_runtime.media.errors import AUDIO_TOO_LONG, INVALID_MEDIA

LIMITS = MediaLimits()


@pytest.mark.parametrize(
    ("fmt", "subtype", "sample_rate"),
    [
        ("WAV", "PCM_16", 44100),
        ("WAV", "FLOAT", 48000),
        ("FLAC", None, 22050),
        ("OGG", "VORBIS", 48000),
        ("MP3", None, 44100),
    ],
)
def test_decodes_to_16k_mono_keeping_the_tone(fmt: str, subtype: str | None, sample_rate: int) -> None:
    mono = make_tone(freq=800, sample_rate=sample_rate, seconds=1.0)
    stereo = np.stack([mono, mono], axis=1)
    pcm = decode_audio(encode_audio(stereo, sample_rate=sample_rate, fmt=fmt, subtype=subtype), limits=LIMITS)
    assert pcm.dtype == np.float32 and pcm.ndim == 1
    # Lossy codecs pad a little; the duration stays within 0.1 s.
    assert pcm.size == pytest.approx(16000, abs=1600)
    assert peak_frequency(pcm, 16000) == pytest.approx(800, abs=2.0)


def test_audio_track_of_an_mp4_decodes_through_pyav() -> None:
    pcm = decode_audio(encode_mp4(frames=10, fps=10, width=32, height=32, with_audio=True), limits=LIMITS)
    assert peak_frequency(pcm, 16000) == pytest.approx(440, abs=2.0)


def test_too_long_audio_is_refused_with_its_length() -> None:
    data = encode_audio(make_tone(freq=440, sample_rate=8000, seconds=3.0), sample_rate=8000, fmt="WAV")
    with pytest.raises(MediaError) as caught:
        decode_audio(data, limits=MediaLimits(max_audio_seconds=2.0))
    assert caught.value.code == AUDIO_TOO_LONG
    assert caught.value.status == 400
    assert str(caught.value) == (
        "the audio is 3.0 s long; this worker accepts at most 2 s (trim it, or raise --max-audio-seconds)"
    )


@pytest.mark.parametrize("data", [b"", b"this is not audio at all" * 10])
def test_unreadable_audio_is_invalid_media(data: bytes) -> None:
    with pytest.raises(MediaError) as caught:
        decode_audio(data, limits=LIMITS)
    assert caught.value.code == INVALID_MEDIA


def test_wav_header_states_the_true_rate() -> None:
    for rate in (24000, 44100, 16000):
        pcm = np.zeros(rate // 2, dtype=np.float32)
        wav = encode_wav(pcm, sample_rate=rate)
        riff, size, wave, fmt, fmt_len, tag, channels, sr, byte_rate, align, bits = struct.unpack(
            "<4sI4s4sIHHIIHH", wav[:36]
        )
        data_tag, data_len = struct.unpack("<4sI", wav[36:44])
        assert (riff, wave, fmt, data_tag) == (b"RIFF", b"WAVE", b"fmt ", b"data")
        assert (fmt_len, tag, channels, sr, byte_rate, align, bits) == (16, 1, 1, rate, rate * 2, 2, 16)
        assert data_len == rate  # rate/2 samples x 2 bytes
        assert size == 36 + data_len == len(wav) - 8
        info = sf.info(io.BytesIO(wav))
        assert (info.samplerate, info.frames, info.channels) == (rate, rate // 2, 1)


def test_pcm16_scaling_and_clipping_are_exact() -> None:
    pcm = np.array([0.0, 1.0, -1.0, 0.5, 2.0, -3.0], dtype=np.float32)
    assert np.frombuffer(to_pcm16(pcm), dtype="<i2").tolist() == [0, 32767, -32767, 16384, 32767, -32767]


def test_wav_roundtrip_keeps_samples() -> None:
    tone = make_tone(freq=1000, sample_rate=24000, seconds=0.25)
    back, rate = sf.read(io.BytesIO(encode_wav(tone, sample_rate=24000)), dtype="float32")
    assert rate == 24000
    np.testing.assert_allclose(back, tone, atol=1 / 32767)


def test_wav_header_rejects_nonsense_rate() -> None:
    with pytest.raises(ValueError, match="sample_rate must be positive"):
        wav_header(sample_rate=0, num_samples=1)
