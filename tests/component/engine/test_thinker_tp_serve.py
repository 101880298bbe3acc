"""`omni serve --thinker-tp-size 2` on the CPU: the real command, the real HTTP API, the official client.

Greedy text must equal the single-process worker's; SIGTERM stops the worker and its follower;
a follower that dies takes the worker down with a clear line instead of hanging it.
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
import openai
import pytest

pytestmark = pytest.mark.slow
READY_TIMEOUT_S = 300.0
FOLLOWER = re.compile(r"thinker TP rank 1/2: follower pid (\d+)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def serve(checkpoint: Path, tmp_path: Path, *extra: str) -> Iterator[Served]:
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    env = {**os.environ, "OMNI_CACHE_DIR": str(checkpoint.parent)}
    command = [sys.executable, "-m", "omni_operator.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--device", "cpu", "--pipeline", "text", "--max-model-len", "512", "--max-batch-size", "4",
               *extra]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
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
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _greedy_text(url: str) -> str:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Tell me about tensor parallelism."}],
        max_tokens=12,
        temperature=0,
    )
    text = completion.choices[0].message.content
    assert text
    return text


def test_tp2_answers_like_tp1_and_stops_its_follower(tiny_checkpoint: Path, tmp_path: Path) -> None:
    with serve(tiny_checkpoint, tmp_path) as single:
        expected = _greedy_text(single.url)
    with serve(tiny_checkpoint, tmp_path, "--thinker-tp-size", "2") as split:
        match = FOLLOWER.search(split.output())
        assert match, split.output()
        follower = int(match.group(1))
        assert alive(follower)
        assert _greedy_text(split.url) == expected
        split.process.send_signal(signal.SIGTERM)
        assert split.process.wait(timeout=60) == 0, split.output()
    assert not alive(follower), "the TP follower outlived its worker"
    assert "thinker TP followers stopped" in split.output()


def test_a_dead_follower_stops_the_worker_loudly(tiny_checkpoint: Path, tmp_path: Path) -> None:
    with serve(tiny_checkpoint, tmp_path, "--thinker-tp-size", "2") as split:
        match = FOLLOWER.search(split.output())
        assert match, split.output()
        os.kill(int(match.group(1)), signal.SIGKILL)
        assert split.process.wait(timeout=30) == 1, split.output()
    assert re.search(r"thinker TP rank 1 \(pid \d+\) exited with code -9", split.output()), split.output()


def test_bad_tp_size_fails_the_worker_with_the_flag_named(tiny_checkpoint: Path) -> None:
    env = {**os.environ, "OMNI_CACHE_DIR": str(tiny_checkpoint.parent)}
    command = [sys.executable, "-m", "omni_operator.cli", "serve", "--host", "127.0.0.1", "--port",
               str(free_port()), "--device", "cpu", "--pipeline", "text", "--thinker-tp-size", "3"]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "--thinker-tp-size 3 does not divide the thinker's 8 attention heads / 4 KV heads" in done.stderr
    assert "use 1, 2 or 4" in done.stderr
    assert "follower pid" not in done.stderr  # refused before any follower started


def test_followers_die_with_their_worker(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """A worker killed outright (no shutdown code runs) leaves no follower holding its GPU."""
    with serve(tiny_checkpoint, tmp_path, "--thinker-tp-size", "2") as split:
        match = FOLLOWER.search(split.output())
        assert match, split.output()
        follower = int(match.group(1))
        split.process.kill()
        split.process.wait(timeout=30)
        deadline = time.monotonic() + 15
        while alive(follower) and time.monotonic() < deadline:
            time.sleep(0.2)
    assert not alive(follower), "the TP follower outlived its killed worker"
