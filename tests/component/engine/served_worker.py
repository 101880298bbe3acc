"""A real `omni serve` process on the CPU for tests: start it, wait for /ready, stop it with SIGTERM.

Shared by the tensor-parallel serve tests, which also watch the helper processes a worker starts
(followers, an image-encoder stage process) come and go by pid.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

READY_TIMEOUT_S = 400.0
STOP_TIMEOUT_S = 90.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_gone(pids: list[int], timeout: float = 20.0) -> list[int]:
    """Wait up to ``timeout`` for the processes to end; returns those still alive."""
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def pid(self, pattern: re.Pattern[str]) -> int:
        """The pid a log line matching ``pattern`` (one group) names."""
        match = pattern.search(self.output())
        assert match, self.output()
        return int(match.group(1))


def serve_command(port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "omni_operator.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--device", "cpu", "--pipeline", "text", "--max-model-len", "512", "--max-batch-size", "4",
            *extra]  # fmt: skip


def cache_env(checkpoint: Path) -> dict[str, str]:
    return {**os.environ, "OMNI_CACHE_DIR": str(checkpoint.parent)}


@contextmanager
def serve(checkpoint: Path, tmp_path: Path, *extra: str) -> Iterator[Served]:
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            serve_command(port, *extra), env=cache_env(checkpoint), stdout=sink, stderr=subprocess.STDOUT
        )
    served = Served(process, f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        with httpx.Client(base_url=served.url, timeout=5) as client:
            while True:
                assert process.poll() is None, served.output()
                assert time.monotonic() < deadline, "omni serve did not become ready\n" + served.output()
                try:
                    if client.get("/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
        yield served
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
