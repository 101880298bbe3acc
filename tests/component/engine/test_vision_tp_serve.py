"""`omni serve --image-encoder-tp-size 2` on the CPU: the real command, the real HTTP API, the official client.

The worker starts its image encoder as a stage process of its own (vision rank 0, which spawns
rank 1). A chat completion with a PNG must answer with the text the single-process worker gives
at temperature 0, also combined with --thinker-tp-size 2 (the thinker's group in the worker, the
vision group in the stage process); SIGTERM stops every process; a worker killed outright or a
vision rank that dies leaves no process behind; a bad size is refused before anything starts.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import torch
from engine_harness import image, request, video
from PIL import Image
from served_worker import (
    READY_TIMEOUT_S,
    Served,
    alive,
    cache_env,
    free_port,
    serve,
    serve_command,
    wait_gone,
)

from omni_runtime.contract.options import EngineOptions
from omni_runtime.pipeline.link.client import StageLinkClient

pytestmark = pytest.mark.slow
STAGE = re.compile(r"image-encoder TP of 2 ranks runs in its own stage process: pid (\d+)")
VISION_FOLLOWER = re.compile(r"image-encoder TP rank 1/2: follower pid (\d+)")
THINKER_FOLLOWER = re.compile(r"thinker TP rank 1/2: follower pid (\d+)")


def png_data_uri() -> str:
    rng = np.random.default_rng(7)
    pixels = rng.integers(0, 255, (64, 80, 3), dtype=np.uint8)
    pixels[:, :40] = (220, 40, 40)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def describe_image(url: str) -> str:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=180)
    model = client.models.list().data[0].id
    completion = client.chat.completions.create(
        model=model,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": png_data_uri()}},
                    {"type": "text", "text": "What is in this picture?"},
                ],
            }
        ],
        max_tokens=12,
        temperature=0,
    )
    text = completion.choices[0].message.content
    assert text
    assert completion.usage is not None and completion.usage.prompt_tokens > 20  # the image's tokens
    return text


@pytest.fixture(scope="module")
def expected(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    with serve(tiny_checkpoint, tmp_path_factory.mktemp("tp1")) as single:
        return describe_image(single.url)


def test_vision_tp2_with_thinker_tp2_answers_like_tp1_and_stops_everything(
    tiny_checkpoint: Path, tmp_path: Path, expected: str
) -> None:
    extra = ("--thinker-tp-size", "2", "--image-encoder-tp-size", "2")
    with serve(tiny_checkpoint, tmp_path, *extra) as split:
        pids = [split.pid(STAGE), split.pid(VISION_FOLLOWER), split.pid(THINKER_FOLLOWER)]
        assert all(alive(p) for p in pids) and len(set(pids)) == 3
        assert describe_image(split.url) == expected
        split.process.send_signal(signal.SIGTERM)
        assert split.process.wait(timeout=90) == 0, split.output()
    assert wait_gone(pids, timeout=5) == [], "a TP process outlived its worker"
    out = split.output()
    assert "image-encoder TP followers stopped" in out and "thinker TP followers stopped" in out
    assert "image-encoder stage process stopped (exit code 0)" in out


def test_vision_tp2_answers_and_dies_with_its_worker(
    tiny_checkpoint: Path, tmp_path: Path, expected: str
) -> None:
    with serve(tiny_checkpoint, tmp_path, "--image-encoder-tp-size", "2") as split:
        stage, follower = split.pid(STAGE), split.pid(VISION_FOLLOWER)
        assert describe_image(split.url) == expected
        # The image encoder's own process reports through the worker's scrape: its calls, and
        # no stage process that failed to answer.
        metrics = httpx.get(f"{split.url}/metrics", timeout=30).text
        calls = re.search(r'^omni_stage_calls_total\{stage="image_encoder"\} (\S+)$', metrics, re.M)
        assert calls is not None and float(calls.group(1)) >= 1, metrics
        assert re.search(r"^omni_stage_stats_failures_total 0\.0$", metrics, re.M), metrics
        split.process.kill()  # no shutdown code runs in the worker
        split.process.wait(timeout=30)
        assert wait_gone([stage, follower]) == [], "the image-encoder processes outlived a killed worker"


def test_a_dead_vision_rank_stops_the_worker_loudly(tiny_checkpoint: Path, tmp_path: Path) -> None:
    with serve(tiny_checkpoint, tmp_path, "--image-encoder-tp-size", "2") as split:
        stage, follower = split.pid(STAGE), split.pid(VISION_FOLLOWER)
        os.kill(follower, signal.SIGKILL)
        assert split.process.wait(timeout=30) == 1, split.output()
        assert wait_gone([stage]) == []
    out = split.output()
    assert re.search(r"image-encoder TP rank 1 \(pid \d+\) exited with code -9", out), out
    assert re.search(r"the image-encoder stage process \(pid \d+\) exited with code 1", out), out


def test_bad_size_fails_the_worker_with_the_flag_named(tiny_checkpoint: Path) -> None:
    command = serve_command(free_port(), "--image-encoder-tp-size", "3")
    done = subprocess.run(
        command, env=cache_env(tiny_checkpoint), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1
    assert (
        "--image-encoder-tp-size 3 does not divide the vision tower's 16 heads (MLP width 256); use 1, 2, 4, 8 or 16"
        in done.stderr
    )
    assert "own stage process" not in done.stderr  # refused before any process started


def test_multi_stage_process_starts_its_image_encoder_stage(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """`omni stage` hosting the image encoder next to other stages (the planner's thinker pod when
    vision is not dedicated) serves image and video embeddings equal to the one-process tower."""
    from omni_runtime.models.qwen2_5_omni.adapter import Qwen25OmniAdapter
    from omni_runtime.models.qwen2_5_omni.loader import load_model

    hosted = frozenset({"image_encoder"})
    options = EngineOptions(model_path=str(tiny_checkpoint), device="cpu")
    adapter = Qwen25OmniAdapter(
        load_model(options, path=tiny_checkpoint, hosted=hosted), options=options, hosted=hosted
    )
    prompt = adapter.preprocess(request("Describe.", media=(image(seed=5), video(seed=6))))
    inputs = {**(prompt.images or {}), **(prompt.videos or {})}
    expected = adapter.encode_vision([inputs])[0]

    port = free_port()
    log = tmp_path / "stage.log"
    command = [sys.executable, "-m", "omni_operator.cli", "stage", "--stages", "image_encoder,mm_aggregate",
               "--host", "127.0.0.1", "--port", str(port), "--model-path", str(tiny_checkpoint),
               "--device", "cpu", "--image-encoder-tp-size", "2"]  # fmt: skip

    async def encode() -> dict[str, torch.Tensor]:
        async with StageLinkClient(f"127.0.0.1:{port}", connect_timeout=READY_TIMEOUT_S) as client:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not (await client.health(timeout=10)).get("ready"):
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                await asyncio.sleep(0.3)
            _, data = await client.call_once("image_encoder.encode", {}, inputs)
            return dict(data)

    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    try:
        got = asyncio.run(encode())
        served = Served(process, "", log)
        pids = [served.pid(STAGE), served.pid(VISION_FOLLOWER)]
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=90)
    assert code == 0, log.read_text()
    assert wait_gone(pids, timeout=5) == []
    for kind in ("image", "video"):
        torch.testing.assert_close(got[kind], expected[kind], rtol=1e-4, atol=1e-4)
