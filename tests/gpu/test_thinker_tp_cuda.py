"""Thinker tensor parallelism on 2 GPUs: NCCL, CUDA graphs with all-reduces inside, torch.compile.

Skipped without 2 CUDA GPUs. Run on the device machine with ``pytest tests/gpu/test_thinker_tp_cuda.py -q``.
The tiny checkpoint in float32: TP=2 (follower on GPU 1) must give TP=1's greedy tokens and
logits to float tolerance, through prefill, graph-captured decode steps and a compaction move;
``omni serve --thinker-tp-size 2 --thinker-gpus 0,1`` must answer and stop cleanly.
"""

from __future__ import annotations

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

from omni_runtime.contract.adapter import RowSampling, ThinkerAdmission, ThinkerPrompt  # noqa: E402
from omni_runtime.contract.options import EngineOptions  # noqa: E402

pytestmark = pytest.mark.gpu
HOSTED = frozenset({"thinker", "mm_aggregate"})
PROMPTS = [list(range(100, 107)), list(range(300, 340)), list(range(500, 509))]


@pytest.fixture(scope="module")
def tiny() -> Path:
    from omni_runtime.models.qwen2_5_omni.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint(progress=False)


def _runner(checkpoint: Path, tp: int) -> tuple[Any, Any]:
    from omni_runtime.models.qwen2_5_omni.adapter import Qwen25OmniAdapter
    from omni_runtime.models.qwen2_5_omni.loader import load_model

    options = EngineOptions(
        model_path=str(checkpoint),
        device="cuda",
        dtype="float32",
        thinker_tp_size=tp,
        thinker_gpus=tuple(range(tp)),
        max_batch_size=4,
        max_model_len=512,
    )
    loaded = load_model(options, path=checkpoint, hosted=HOSTED)
    adapter = Qwen25OmniAdapter(loaded, options=options, hosted=HOSTED)
    runner = adapter.thinker_runner(slots=4, max_len=512)
    runner.warmup()  # every rank captures the same buckets, in the same order
    return adapter, runner


def _trace(adapter: Any, runner: Any) -> tuple[list[Any], list[list[int]]]:
    device = adapter.placement.thinker
    rows = []
    for slot, ids in enumerate(PROMPTS):
        with torch.inference_mode():
            embeds = adapter.loaded.embed(torch.tensor(ids, device=device))
        positions = torch.arange(len(ids)).view(1, -1).expand(3, -1)
        prompt = ThinkerPrompt(input_ids=ids, embeds=embeds, positions=positions, rope_delta=slot)
        rows.append(ThinkerAdmission(slot, prompt, RowSampling(temperature=0.0), want_vectors=False))
    tokens = [[t for t, _ in runner.admit(rows)]]
    logits = []
    decoder = runner.decoder
    n, longest = 3, max(len(p) for p in PROMPTS)
    for step in range(8):
        if step == 4:
            runner.move(2, 0, int(decoder.lengths[2]))
            n = 2
        with torch.inference_mode():
            out = decoder.decode(n, max_length=longest + 1 + step)
            logits.append(out.logits.float().cpu().clone())
            chosen = out.logits.argmax(-1)
            decoder.last_ids[:n] = chosen
            decoder.lengths[:n] += 1
        tokens.append(chosen.tolist())
    return logits, tokens


def test_tp2_matches_tp1_on_two_gpus(tiny: Path) -> None:
    one_logits, one_tokens = _trace(*_runner(tiny, 1))
    adapter, runner = _runner(tiny, 2)
    try:
        assert runner.decoder.cuda_graphs, "decode graphs with all-reduces inside should capture"
        two_logits, two_tokens = _trace(adapter, runner)
    finally:
        runner.close()
    assert two_tokens == one_tokens
    for a, b in zip(one_logits, two_logits, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-3)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_omni_serve_tp2_on_gpus_0_1(tiny: Path, tmp_path: Path) -> None:
    port = _free_port()
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "omni_operator.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--device", "cuda", "--pipeline", "text", "--thinker-tp-size", "2", "--thinker-gpus", "0,1",
               "--max-model-len", "1024", "--max-batch-size", "8"]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(command, env={**os.environ, "OMNI_CACHE_DIR": str(tiny.parent)},
                                   stdout=sink, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        with httpx.Client(base_url=url, timeout=60) as client:
            while True:
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                try:
                    if client.get("/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.5)
            reply = client.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16, "temperature": 0},
            )
            assert reply.status_code == 200, reply.text
        follower = int(re.search(r"follower pid (\d+) on GPU 1", log.read_text()).group(1))  # type: ignore[union-attr]
        apps = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout.split()
        if apps:  # inside a container nvidia-smi may not list processes
            assert str(follower) in apps and str(process.pid) in apps, (
                f"nvidia-smi lists compute pids {apps}; worker {process.pid}, follower {follower}"
            )
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=120)
    assert code == 0, log.read_text()
    assert (
        not Path(f"/proc/{follower}").exists() or "Z" in Path(f"/proc/{follower}/stat").read_text().split()[2]
    )
