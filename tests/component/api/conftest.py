"""One real worker per test session: the engine on the tiny checkpoint behind uvicorn on loopback
(and one on the tiny Qwen3-Omni-MoE checkpoint for the tests that run against both families).

Starting the engine costs seconds, so every HTTP test shares it; tests that need other settings
(a text-only worker with tiny limits) start their own with `start_worker`. Speech requests cap
the talker with ``stage_params.talker.max_tokens`` so the random talker stays quick on a CPU.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn

from omni_runtime.api import ApiSettings, build_app
from omni_runtime.contract.engine import Engine
from omni_runtime.contract.options import EngineOptions
from omni_runtime.media.limits import MediaLimits
from omni_runtime.realtime import RealtimeSettings

READY_TIMEOUT_S = 300.0  # the CPU is shared with other work; loading usually takes seconds
SHORT_SPEECH = {"talker": {"max_tokens": 60}}  # at most 60 codec tokens: ~1.2 s of audio


@dataclass
class Worker:
    url: str
    engine: Engine
    media_dir: Path

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120.0, **kwargs)  # type: ignore[arg-type]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def tiny_checkpoint() -> Path:
    """The cached tiny checkpoint ($OMNI_CACHE_DIR/tiny or ~/.cache/omni/tiny), made once per machine."""
    from omni_runtime.models.qwen2_5_omni.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint(progress=False)


def make_engine(checkpoint: Path, *, pipeline: str = "streaming-speech") -> Engine:
    """The real pipeline engine on the tiny checkpoint, on the CPU."""
    from omni_runtime.pipeline import build_engine

    options = EngineOptions(
        model_path=str(checkpoint),
        pipeline=pipeline,
        device="cpu",
        max_batch_size=8,
        max_model_len=2048,
        session_kv_mb=64,  # conversation KV on, with a small budget
    )
    return build_engine(options)


def tiny_settings(checkpoint: Path, **overrides: object) -> ApiSettings:
    from omni_runtime.models.qwen2_5_omni.tiny import is_tiny_checkpoint
    from omni_runtime.models.qwen3_omni_moe.tiny import is_tiny_checkpoint as is_tiny_qwen3

    # What `omni serve` decides for the tiny checkpoint: its model card says the weights are random.
    random = is_tiny_checkpoint(checkpoint) or is_tiny_qwen3(checkpoint)
    return ApiSettings(random_weights=random, model_path=str(checkpoint), **overrides)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("media")


def start_worker(
    *,
    engine: Engine,
    settings: ApiSettings,
    media_dir: Path,
    realtime_settings: RealtimeSettings | None = None,
) -> Iterator[Worker]:
    port = free_port()
    app = build_app(engine=engine, settings=settings, realtime_settings=realtime_settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    with httpx.Client(base_url=url, timeout=5.0) as client:
        while True:
            try:
                if client.get("/ready").status_code == 200:
                    break
                health = client.get("/health")
                if health.status_code != 200:  # the engine failed to start: say why, now
                    server.should_exit = True
                    raise RuntimeError(f"worker on {url} failed to start: {health.text}")
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or not thread.is_alive():
                server.should_exit = True
                raise RuntimeError(f"worker on {url} did not become ready within {READY_TIMEOUT_S:.0f} s")
            time.sleep(0.1)
    try:
        yield Worker(url=url, engine=engine, media_dir=media_dir)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="session")
def worker(media_dir: Path, tiny_checkpoint: Path) -> Iterator[Worker]:
    """The shared speech worker (streaming-speech pipeline: audio arrives in chunks)."""
    settings = tiny_settings(
        tiny_checkpoint, media=MediaLimits(allowed_local_media_path=str(media_dir)), max_tokens_limit=256
    )
    yield from start_worker(engine=make_engine(tiny_checkpoint), settings=settings, media_dir=media_dir)


@pytest.fixture(scope="session")
def qwen3_worker(media_dir: Path) -> Iterator[Worker]:
    """A streaming-speech worker on the tiny Qwen3-Omni-MoE checkpoint (talker frames, Code2Wav)."""
    from omni_runtime.models.qwen3_omni_moe.tiny import ensure_tiny_checkpoint

    checkpoint = ensure_tiny_checkpoint(progress=False)
    settings = tiny_settings(
        checkpoint, media=MediaLimits(allowed_local_media_path=str(media_dir)), max_tokens_limit=256
    )
    yield from start_worker(engine=make_engine(checkpoint), settings=settings, media_dir=media_dir)


@pytest.fixture(params=["qwen2_5_omni", "qwen3_omni_moe"])
def speech_worker(request: pytest.FixtureRequest) -> Worker:
    """The speech worker of each model family in turn."""
    return request.getfixturevalue("worker" if request.param == "qwen2_5_omni" else "qwen3_worker")
