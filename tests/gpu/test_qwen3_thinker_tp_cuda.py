"""Qwen3-Omni-MoE thinker tensor parallelism on 2 GPUs: NCCL all-reduces inside the decode step's
CUDA graphs, every expert split by channel, the router replicated, DeepStack features broadcast.

Skipped without 2 CUDA GPUs. Run on the device machine with
``pytest tests/gpu/test_qwen3_thinker_tp_cuda.py -q``. ``omni serve --tiny-family qwen3_omni_moe``
in float32 with ``--thinker-tp-size 2`` must give the greedy text of the same server with TP=1,
for text, audio and image prompts made here, and stop its follower when it stops.
"""

from __future__ import annotations

import base64
import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if torch.cuda.device_count() < 2:
    pytest.skip("needs 2 CUDA GPUs", allow_module_level=True)

import httpx  # noqa: E402
import soundfile  # noqa: E402
from PIL import Image  # noqa: E402

pytestmark = pytest.mark.gpu


def _png() -> str:
    pixels = np.zeros((64, 96, 3), dtype=np.uint8)
    pixels[..., 0] = np.linspace(0, 255, 96, dtype=np.uint8)[None, :]
    pixels[16:48, 24:72, 2] = 200
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _wav() -> str:
    t = np.arange(16000 * 0.8) / 16000
    buffer = io.BytesIO()
    soundfile.write(buffer, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000, format="WAV")
    return base64.b64encode(buffer.getvalue()).decode()


PROMPTS = {
    "text": [{"type": "text", "text": "Tell me a story."}],
    "audio": [
        {"type": "input_audio", "input_audio": {"data": _wav(), "format": "wav"}},
        {"type": "text", "text": "What do you hear?"},
    ],
    "image": [
        {"type": "image_url", "image_url": {"url": _png()}},
        {"type": "text", "text": "What is this?"},
    ],
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(tp: int, cache: Path, log: Path) -> dict[str, str]:
    port = _free_port()
    command = [sys.executable, "-m", "omni_operator.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--tiny-family", "qwen3_omni_moe", "--device", "cuda", "--dtype", "float32", "--pipeline", "text",
               "--thinker-tp-size", str(tp), "--thinker-gpus", ",".join(str(g) for g in range(tp)),
               "--max-model-len", "2048", "--max-batch-size", "4"]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(command, env={**os.environ, "OMNI_CACHE_DIR": str(cache)},
                                   stdout=sink, stderr=subprocess.STDOUT)  # fmt: skip
    answers: dict[str, str] = {}
    try:
        deadline = time.monotonic() + 600
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            while True:
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                try:
                    if client.get("/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.5)
            for name, content in PROMPTS.items():
                reply = client.post(
                    "/v1/chat/completions",
                    json={
                        "messages": [{"role": "user", "content": content}],
                        "max_tokens": 12,
                        "temperature": 0,
                    },
                )
                assert reply.status_code == 200, reply.text
                answers[name] = reply.json()["choices"][0]["message"]["content"]
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=120)
    assert code == 0, log.read_text()
    return answers


def test_tp2_answers_equal_tp1_on_two_gpus(tmp_path: Path) -> None:
    one = _answers(1, tmp_path / "cache", tmp_path / "tp1.log")
    two = _answers(2, tmp_path / "cache", tmp_path / "tp2.log")
    assert all(one.values()), one
    assert two == one
    assert "follower pid" in (tmp_path / "tp2.log").read_text()
