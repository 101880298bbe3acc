"""Speech out: a WAV whose header states the talker's true rate, PCM16, and streamed audio deltas,
from both model families (Qwen2.5-Omni's talker and vocoder, Qwen3-Omni's talker frames and Code2Wav)."""

from __future__ import annotations

import base64
import io
import struct
import time

import numpy as np
import soundfile as sf
from api_sse import deltas, parse_sse

from conftest import SHORT_SPEECH, Worker

SPEECH = {"modalities": ["text", "audio"], "audio": {"format": "wav"}, "stage_params": SHORT_SPEECH}
HELLO = [{"role": "user", "content": "Say something."}]


def _wav_header(data: bytes) -> tuple[int, int, int, int]:
    riff, _, wave, fmt, _, tag, channels, rate, _, _, bits = struct.unpack("<4sI4s4sIHHIIHH", data[:36])
    assert (riff, wave, fmt) == (b"RIFF", b"WAVE", b"fmt ")
    return tag, channels, rate, bits


def test_speech_reply_is_a_valid_wav_at_the_true_rate(speech_worker: Worker) -> None:
    with speech_worker.client() as client:
        response = client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 12, **SPEECH})
    assert response.status_code == 200, response.text
    body = response.json()
    message = body["choices"][0]["message"]
    audio = message["audio"]
    assert audio["id"].startswith("audio_")
    assert audio["expires_at"] > 0
    assert audio["transcript"] == message["content"]
    wav = base64.b64decode(audio["data"])
    assert _wav_header(wav) == (1, 1, 24000, 16)  # PCM, mono, the talker's rate, 16-bit
    assert audio["sample_rate"] == speech_worker.engine.output_sample_rate == 24000
    pcm, rate = sf.read(io.BytesIO(wav), dtype="float32")
    assert rate == 24000
    seconds = pcm.size / rate
    assert seconds > 0.05
    # The WAV holds exactly the audio the engine reported generating.
    assert abs(seconds - body["usage"]["audio_seconds"]) < 0.01
    assert np.isfinite(pcm).all()


def test_pcm16_format_is_raw_samples(speech_worker: Worker) -> None:
    body = {**SPEECH, "messages": HELLO, "max_tokens": 8, "audio": {"format": "pcm16"}}
    with speech_worker.client() as client:
        reply = client.post("/v1/chat/completions", json=body).json()
    audio = reply["choices"][0]["message"]["audio"]
    raw = base64.b64decode(audio["data"])
    assert audio["format"] == "pcm16" and audio["sample_rate"] == 24000
    assert not raw.startswith(b"RIFF") and len(raw) % 2 == 0
    assert abs(len(raw) / 2 / 24000 - reply["usage"]["audio_seconds"]) < 0.01


def test_stream_carries_text_and_audio_deltas_as_produced(speech_worker: Worker) -> None:
    body = {"messages": HELLO, "max_tokens": 16, "ignore_eos": True, "stream": True, **SPEECH}
    arrivals: list[tuple[float, str]] = []
    with (
        speech_worker.client() as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        began = time.monotonic()
        for line in response.iter_lines():
            arrivals.append((time.monotonic() - began, line))
    events, done = parse_sse("\n".join(line for _, line in arrivals))
    assert done
    parts = deltas(events)
    texts = [d for d in parts if d.get("content")]
    audios = [d["audio"] for d in parts if d.get("audio")]
    assert len(texts) >= 4
    assert len(audios) >= 2  # chunked, not one aggregate at the end
    assert len({a["id"] for a in audios}) == 1
    total = 0
    for audio in audios:
        wav = base64.b64decode(audio["data"])
        assert _wav_header(wav)[2] == audio["sample_rate"] == 24000
        total += sf.info(io.BytesIO(wav)).frames
    assert abs(total / 24000 - events[-1]["usage"]["audio_seconds"]) < 0.01
    # Chunks are sent as the vocoder makes them: the first arrives well before the last.
    audio_times = [t for t, line in arrivals if '"audio":{' in line]
    assert audio_times[-1] - audio_times[0] > 0.05


def test_voice_is_passed_to_the_talker(speech_worker: Worker) -> None:
    body = {
        "messages": HELLO,
        "max_tokens": 4,
        "modalities": ["text", "audio"],
        "audio": {"voice": "Chelsie"},
    }
    with speech_worker.client() as client:
        assert client.post("/v1/chat/completions", json=body).status_code == 200
