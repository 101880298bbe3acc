"""Live workers for the realtime component tests: the real engine on a tiny checkpoint, behind the router.

A background thread runs its own event loop with: the worker app exactly as `omni serve` builds it
(`build_app`, which serves the realtime endpoints too), and the router in front of it
(a static worker table). Tests are clients over real sockets: the official openai client,
websockets and httpx, through the router. Extra bare workers with other limits share the started
engine (`live.extra_worker(...)`). Starting the engine costs tens of seconds on a CPU, so it
happens once per test session and family.

`live` is the Qwen2.5-Omni worker every test uses; `live_qwen3` is a second one on the tiny
Qwen3-Omni-MoE checkpoint (its own router too). `family_live` is each of them in turn: the tests
that take it are the representative subset that runs for both families (one per protocol, named in
each module's docstring), so the run time does not double.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

WORKER_ID = "tiny-w0"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LiveWorker:
    loop: asyncio.AbstractEventLoop
    engine: Any
    realtime: Any  # RealtimeServer of the main worker
    worker_host: str
    router_host: str
    servers: list[Any] = field(default_factory=list)

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 300) -> Any:
        """Run a coroutine on the worker's loop (where the engine lives) and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def extra_worker(self, **overrides: Any) -> tuple[str, Any]:
        """A bare worker app (realtime endpoints only) with other limits, on the same engine."""
        return self.call(_serve_extra(self, overrides))


async def _serve(app: Any, port: int) -> Any:
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", ws_max_size=64 << 20)
    )
    asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    return server


async def _serve_extra(live: LiveWorker, overrides: dict[str, Any]) -> tuple[str, Any]:
    from fastapi import FastAPI

    from omni_runtime.api.streaming_input.routes import install_streaming_input
    from omni_runtime.realtime import RealtimeServer, RealtimeSettings

    realtime = RealtimeServer(engine=live.engine, settings=RealtimeSettings(worker_id=WORKER_ID, **overrides))
    app = FastAPI()
    app.include_router(realtime.router())
    install_streaming_input(app, realtime.streaming)
    port = free_port()
    live.servers.append(await _serve(app, port))
    return f"127.0.0.1:{port}", realtime


async def _start(holder: dict[str, Any], ready: threading.Event, family: str) -> None:
    from omni_runtime.api.app import build_app
    from omni_runtime.api.settings import ApiSettings
    from omni_runtime.contract.options import EngineOptions
    from omni_runtime.pipeline import build_engine
    from omni_runtime.realtime import RealtimeSettings
    from omni_runtime.router.app import RouterApp
    from omni_runtime.router.context import RouterConfig
    from omni_runtime.router.sources import StaticSource
    from omni_runtime.router.table import WorkerSpec

    engine = build_engine(
        EngineOptions(
            tiny_family=family,  # no model path: the family's tiny checkpoint (written once)
            pipeline="streaming-speech",
            device="cpu",
            max_batch_size=8,
            worker_id=WORKER_ID,
            session_kv_mb=64,  # conversation KV on, with a small budget
        )
    )
    app = build_app(
        engine=engine,
        settings=ApiSettings(worker_id=WORKER_ID),
        realtime_settings=RealtimeSettings(worker_id=WORKER_ID, max_payload_per_session=2 * 1024 * 1024),
    )
    realtime = app.state.omni.realtime
    worker_port, router_port = free_port(), free_port()
    servers = [await _serve(app, worker_port)]
    async with httpx.AsyncClient() as client:
        deadline = time.monotonic() + 900
        while (await client.get(f"http://127.0.0.1:{worker_port}/ready")).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the worker did not become ready in 900 s")
            await asyncio.sleep(0.5)
    router = RouterApp(
        config=RouterConfig(health_interval=0.5, log_requests=False),
        source=StaticSource(
            [WorkerSpec(id=WORKER_ID, url=f"http://127.0.0.1:{worker_port}", revision="test")]
        ),
    )
    servers.append(await _serve(router, router_port))
    async with httpx.AsyncClient() as client:
        while (await client.get(f"http://127.0.0.1:{router_port}/ready")).status_code != 200:
            await asyncio.sleep(0.2)
    holder["live"] = LiveWorker(
        loop=asyncio.get_running_loop(),
        engine=engine,
        realtime=realtime,
        worker_host=f"127.0.0.1:{worker_port}",
        router_host=f"127.0.0.1:{router_port}",
        servers=servers,
    )
    ready.set()
    holder["stop"] = asyncio.Event()
    await holder["stop"].wait()
    for server in reversed(holder["live"].servers):
        server.should_exit = True
    await asyncio.sleep(0.5)
    await realtime.aclose()


def _live(family: str) -> Iterator[LiveWorker]:
    holder: dict[str, Any] = {}
    ready = threading.Event()

    def run() -> None:
        try:
            asyncio.run(_start(holder, ready, family))
        except BaseException as exc:  # surfaced to the fixture below
            holder["error"] = exc
            ready.set()

    thread = threading.Thread(target=run, name=f"realtime-live-{family}", daemon=True)
    thread.start()
    ready.wait(timeout=1200)
    if "error" in holder:
        raise holder["error"]
    if "live" not in holder:
        pytest.fail("the live worker did not start in time")
    yield holder["live"]
    try:
        holder["live"].loop.call_soon_threadsafe(holder["stop"].set)
    except RuntimeError:  # its loop ended before the session did (once in CI): say why, not fail
        # Every test that used this worker ran before teardown, and each failed on its own if the
        # worker was gone; what ended the loop afterwards is worth a trace, not a failed run.
        print(f"\nthe live {family} worker's loop had ended: {holder.get('error')!r}", file=sys.__stderr__)
        return
    thread.join(timeout=30)


@pytest.fixture(scope="session")
def live() -> Iterator[LiveWorker]:
    """The Qwen2.5-Omni worker behind its router."""
    yield from _live("qwen2_5_omni")


@pytest.fixture(scope="session")
def live_qwen3() -> Iterator[LiveWorker]:
    """The Qwen3-Omni-MoE worker (talker frames, windowed Code2Wav) behind its own router."""
    yield from _live("qwen3_omni_moe")


def _live_of(request: pytest.FixtureRequest, family: str) -> LiveWorker:
    return request.getfixturevalue("live" if family == "qwen2_5_omni" else "live_qwen3")


@pytest.fixture(params=["qwen2_5_omni", "qwen3_omni_moe"])
def family_live(request: pytest.FixtureRequest) -> LiveWorker:
    """Each family's live worker in turn, for the tests that run against both."""
    return _live_of(request, request.param)


@pytest.fixture
def live_of(request: pytest.FixtureRequest) -> Callable[[str], LiveWorker]:
    """The live worker of a family named by a test's own parameters (one case of a table per family)."""
    return lambda family: _live_of(request, family)


@pytest.fixture(scope="session")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """16 kHz mono float32 speech made by espeak-ng (skips when espeak-ng is not installed)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install -y espeak-ng)")
    import soundfile as sf

    from omni_runtime.media.resample import resample

    def make(text: str, name: str) -> np.ndarray:
        path = Path(tmp_path_factory.mktemp("speech")) / f"{name}.wav"
        subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True, timeout=60)
        pcm, rate = sf.read(path, dtype="float32")
        return resample(pcm, orig_sr=rate, target_sr=16_000)

    return make
