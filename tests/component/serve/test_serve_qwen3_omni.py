"""A real `omni serve --model-path <tiny Qwen3-Omni-MoE> --pipeline streaming-speech` answers the
official `openai` client: chat completions (plain and streamed; text, audio and image in),
`/v1/models`, and speech out (the talker's frames through Code2Wav, whole and as SSE deltas)."""

from __future__ import annotations

import base64
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
from PIL import Image
from serve_process import free_port, ready

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

REPO = Path(__file__).resolve().parents[3]
READY_S = 300.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from omni_runtime.models.qwen3_omni_moe.tiny import ensure_tiny_checkpoint

    checkpoint = ensure_tiny_checkpoint(progress=False)
    logs = tmp_path_factory.mktemp("serve-qwen3")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "omni_operator.cli", "serve", "--model-path", str(checkpoint),
            "--pipeline", "streaming-speech", "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
            "--max-batch-size", "4"]  # fmt: skip
    err = logs / "stderr"
    with err.open("wb") as stderr:
        popen = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr, cwd=REPO, env={**os.environ})
    try:
        deadline = time.monotonic() + READY_S
        while not ready(url):
            assert popen.poll() is None, err.read_text()[-3000:]
            assert time.monotonic() < deadline, err.read_text()[-3000:]
            time.sleep(0.5)
        yield url
    finally:
        popen.send_signal(signal.SIGINT)
        try:
            popen.wait(timeout=60)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(timeout=10)


def _client(url: str):
    from openai import OpenAI

    return OpenAI(
        base_url=f"{url}/v1", api_key="unused", http_client=httpx.Client(trust_env=False, timeout=120)
    )


def test_chat_completion_and_models(server: str) -> None:
    client = _client(server)
    model = client.models.list().data[0].id
    assert model == "tiny-qwen3-omni-moe"
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Hello, how are you today?"}],
        max_tokens=8,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 8
    # Streaming gives the same greedy text.
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Hello, how are you today?"}],
        max_tokens=8,
        temperature=0,
        stream=True,
    )
    assert (
        "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        == choice.message.content
    )


def test_audio_in(server: str) -> None:
    t = np.arange(16000) / 16000
    buffer = io.BytesIO()
    sf.write(buffer, (0.4 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000, format="WAV")
    audio = {"data": base64.b64encode(buffer.getvalue()).decode("ascii"), "format": "wav"}
    client = _client(server)
    reply = client.chat.completions.create(
        model="tiny-qwen3-omni-moe",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "input_audio", "input_audio": audio},
                    {"type": "text", "text": "What is this?"},
                ],
            }
        ],
        max_tokens=6,
        temperature=0,
    )
    assert reply.usage is not None and reply.usage.prompt_tokens > 20  # the audio's placeholders counted
    assert reply.choices[0].message.content


def test_image_in_and_speech_out(server: str) -> None:
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((32, 48, 3), dtype=np.uint8)).save(buffer, format="PNG")
    uri = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": uri}},
                {"type": "text", "text": "What is this?"},
            ],
        }
    ]
    speech = {
        "model": "tiny-qwen3-omni-moe",
        "messages": messages,
        "max_tokens": 6,
        "temperature": 0,
        "modalities": ["text", "audio"],
        "audio": {"voice": "Ethan", "format": "wav"},
        "extra_body": {"stage_params": {"talker": {"max_tokens": 24}}},
    }
    client = _client(server)
    reply = client.chat.completions.create(**speech)
    assert reply.usage is not None and reply.usage.prompt_tokens > 10
    audio = reply.choices[0].message.audio
    assert audio is not None and audio.transcript == reply.choices[0].message.content
    pcm, rate = sf.read(io.BytesIO(base64.b64decode(audio.data)), dtype="float32")
    assert rate == 24000 and pcm.size > 0 and (pcm.size + 555) % 1920 == 0  # whole Code2Wav frames
    chunks = [
        c.choices[0].delta.audio
        for c in client.chat.completions.create(**speech, stream=True)
        if c.choices and c.choices[0].delta.audio
    ]
    assert chunks and sum(sf.info(io.BytesIO(base64.b64decode(c.data))).frames for c in chunks) > 0
