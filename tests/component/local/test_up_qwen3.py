"""`omni up -f examples/tiny-qwen3-cpu.yaml`, for real: the Qwen3-Omni-MoE family under `omni up`.

The example names `architecture: qwen3_omni` with `source: tiny`, so the planned worker command
carries `--tiny-family qwen3_omni_moe` and the worker process writes (once) and serves the tiny
Qwen3-Omni-MoE checkpoint. Through the router: /v1/models reports the model, and the official
openai client gets text and streamed speech (talker frames through the windowed Code2Wav) back.
"""

from __future__ import annotations

import base64
import io
import signal
from collections.abc import Iterator

import httpx
import openai
import pytest
import soundfile as sf
from up_harness import REPO, OmniUp, alive, children, free_base_port, free_port, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EXAMPLE = REPO / "examples" / "tiny-qwen3-cpu.yaml"
READY_S = 300.0
SHORT_SPEECH = {"stage_params": {"talker": {"max_tokens": 24}}}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniUp]:
    instance = OmniUp(
        state_dir=tmp_path_factory.mktemp("up"), router_port=free_port(), base_port=free_base_port()
    )
    instance.start(EXAMPLE)
    try:
        instance.wait_line(r"^ready: ", timeout=READY_S)
        yield instance
    finally:
        instance.cleanup()


def test_the_qwen3_worker_serves_the_tiny_qwen3_checkpoint(up: OmniUp) -> None:
    assert (
        up.wait_line(r"^ready: ", timeout=1)
        == f"ready: 1 worker of 'tiny-qwen3-omni' behind the router at {up.url}"
    )
    table = up.table()
    assert sorted(table) == ["tiny-qwen3-w0"] and table["tiny-qwen3-w0"]["state"] == "ready"
    (card,) = httpx.get(f"{up.url}/v1/models", timeout=30, trust_env=False).json()["data"]
    assert card["id"] == "tiny-qwen3-omni"
    # The card's root is the checkpoint the worker loaded: the Qwen3-Omni-MoE tiny one, random weights.
    assert card["root"].endswith("tiny-qwen3-omni-moe"), card["root"]
    assert card["metadata"]["random_weights"] is True
    assert card["metadata"]["output_sample_rate"] == 24000


def test_text_and_streamed_speech_through_the_router(up: OmniUp) -> None:
    client = openai.OpenAI(base_url=f"{up.url}/v1", api_key="unused", max_retries=0, timeout=120)
    completion = client.chat.completions.create(
        model="tiny-qwen3-omni", messages=[{"role": "user", "content": "Hello!"}], max_tokens=6
    )
    assert completion.model == "tiny-qwen3-omni"
    assert completion.usage is not None and 1 <= completion.usage.completion_tokens <= 6

    stream = client.chat.completions.create(
        model="tiny-qwen3-omni",
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=6,
        modalities=["text", "audio"],
        audio={"voice": "Aiden", "format": "wav"},
        stream=True,
        extra_body=SHORT_SPEECH,
    )
    chunks = [c.choices[0].delta.audio for c in stream if c.choices and c.choices[0].delta.audio]
    assert chunks
    for audio in chunks:  # each delta is a WAV of whole Code2Wav frames (1920 samples at 24 kHz)
        info = sf.info(io.BytesIO(base64.b64decode(audio.data)))
        assert info.samplerate == 24000 and info.frames > 0


def test_ctrl_c_stops_the_qwen3_worker_and_the_router(up: OmniUp) -> None:
    assert up.popen is not None
    pids = children(up.popen.pid)
    assert len(pids) >= 2  # the worker and the router
    assert up.stop(signal.SIGINT, timeout=60) == 0
    wait_until(lambda: not any(alive(pid) for pid in pids), timeout=10, what="no process left", tail=up.tail)
    assert up.supervisor_lines()[-1] == "stopped"
    assert not any("Traceback" in line for line in up.lines)
