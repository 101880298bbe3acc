"""Image-encoder tensor parallelism on 2 GPUs: NCCL, the two vision ranks on two GPUs.

Skipped without 2 CUDA GPUs. Run on the device machine with ``pytest tests/gpu/test_vision_tp_cuda.py -q``.

- The dedicated image-encoder process, started exactly as the operator's image-encoder pod runs
  (``omni stage --stages image_encoder --image-encoder-tp-size 2 --image-encoder-gpus 0,1``),
  must return the image and video embeddings of the single-GPU tower (tiny checkpoint, float32)
  over its stage link, with rank 1 on GPU 1.
- ``omni serve`` with thinker TP=2 and image-encoder TP=2 (on GPUs 2,3 when there are 4) answers
  a chat completion with an image and stops every process on SIGTERM.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if torch.cuda.device_count() < 2:
    pytest.skip("needs 2 CUDA GPUs", allow_module_level=True)

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from omni_runtime.contract.engine import ChatTurn, GenerationRequest, MediaInput, SamplingParams  # noqa: E402
from omni_runtime.contract.options import EngineOptions  # noqa: E402

pytestmark = pytest.mark.gpu
FOLLOWER = re.compile(r"image-encoder TP rank 1/2: follower pid (\d+) on GPU (\d+)")


@pytest.fixture(scope="module")
def tiny() -> Path:
    from omni_runtime.models.qwen2_5_omni.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint(progress=False)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _gpu_pids() -> list[str]:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        )
    except FileNotFoundError:
        return []
    return done.stdout.split()


def _media() -> tuple[MediaInput, ...]:
    rng = np.random.default_rng(0)
    picture = MediaInput(kind="image", data=rng.integers(0, 255, (224, 280, 3), dtype=np.uint8))
    clip = MediaInput(kind="video", data=rng.integers(0, 255, (4, 112, 112, 3), dtype=np.uint8), fps=2.0)
    return picture, clip


def _vision_inputs(adapter: Any) -> dict[str, Any]:
    request = GenerationRequest(
        request_id="v",
        turns=(ChatTurn(role="user", text="Describe.", media=_media()),),
        sampling=SamplingParams(max_tokens=4),
    )
    prompt = adapter.preprocess(request)
    return {**(prompt.images or {}), **(prompt.videos or {})}


async def _encode_remote(address: str, inputs: dict[str, Any]) -> dict[str, Any]:
    from omni_runtime.pipeline.link.client import StageLinkClient

    async with StageLinkClient(address, connect_timeout=600) as client:
        deadline = time.monotonic() + 600
        while not (await client.health(timeout=10)).get("ready"):
            assert time.monotonic() < deadline, "the image-encoder stage did not become ready"
            await asyncio.sleep(0.5)
        _, data = await client.call_once("image_encoder.encode", {}, inputs)
        return dict(data)


def test_dedicated_image_encoder_tp2_matches_one_gpu(tiny: Path, tmp_path: Path) -> None:
    from omni_runtime.models.qwen2_5_omni.adapter import Qwen25OmniAdapter
    from omni_runtime.models.qwen2_5_omni.loader import load_model

    hosted = frozenset({"image_encoder"})
    options = EngineOptions(model_path=str(tiny), device="cuda", dtype="float32", image_encoder_gpus=(0,))
    adapter = Qwen25OmniAdapter(load_model(options, path=tiny, hosted=hosted), options=options, hosted=hosted)
    inputs = _vision_inputs(adapter)
    expected = adapter.encode_vision([inputs])[0]

    port = _free_port()
    log = tmp_path / "stage.log"
    command = [sys.executable, "-m", "omni_runtime.entrypoints.stage", "--stages", "image_encoder", "--host", "127.0.0.1",
               "--port", str(port), "--model-path", str(tiny), "--device", "cuda", "--dtype", "float32",
               "--image-encoder-tp-size", "2", "--image-encoder-gpus", "0,1"]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    try:
        got = asyncio.run(_encode_remote(f"127.0.0.1:{port}", inputs))
        match = FOLLOWER.search(log.read_text())
        assert match and match.group(2) == "1", log.read_text()
        follower = int(match.group(1))
        apps = _gpu_pids()
        if apps:  # inside a container nvidia-smi may not list processes
            assert str(follower) in apps and str(process.pid) in apps, (
                f"nvidia-smi lists compute pids {apps}; process {process.pid}, follower {follower}"
            )
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=120)
    assert code == 0, log.read_text()
    assert not _alive(follower)
    for kind in ("image", "video"):
        assert expected[kind] is not None
        torch.testing.assert_close(got[kind].float(), expected[kind].float().cpu(), rtol=1e-3, atol=1e-3)


def _png_uri() -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(_media()[0].data)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def test_omni_serve_thinker_tp2_and_image_encoder_tp2(tiny: Path, tmp_path: Path) -> None:
    vision_gpus = "2,3" if torch.cuda.device_count() >= 4 else "0,1"
    port = _free_port()
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "omni_operator.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--device", "cuda", "--pipeline", "text", "--thinker-tp-size", "2", "--thinker-gpus", "0,1",
               "--image-encoder-tp-size", "2", "--image-encoder-gpus", vision_gpus,
               "--max-model-len", "2048", "--max-batch-size", "8"]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(command, env={**os.environ, "OMNI_CACHE_DIR": str(tiny.parent)},
                                   stdout=sink, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 600
        with httpx.Client(base_url=url, timeout=120) as client:
            while True:
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                try:
                    if client.get("/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.5)
            content = [
                {"type": "image_url", "image_url": {"url": _png_uri()}},
                {"type": "text", "text": "What?"},
            ]
            reply = client.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": content}], "max_tokens": 16, "temperature": 0},
            )
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["prompt_tokens"] > 50
        text = log.read_text()
        pids = [int(p) for p in re.findall(r"follower pid (\d+)", text)]
        pids.append(int(re.search(r"own stage process: pid (\d+)", text).group(1)))  # type: ignore[union-attr]
        assert len(pids) == 3, text
        assert re.search(rf"image-encoder TP rank 1/2: follower pid \d+ on GPU {vision_gpus[-1]}", text), text
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=180)
    assert code == 0, log.read_text()
    time.sleep(2)
    assert [p for p in pids if _alive(p)] == [], log.read_text()
