"""Real processes on loopback for router tests: small upstream workers and `omni router` itself.

Every process is started by a fixture, found by its pid, and stopped at teardown. Waits poll with
a deadline and fail with the router's log tail, so a broken router shows why instead of hanging.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
UPSTREAM = HERE / "upstream.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(check: Callable[[], bool], *, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{tail}")


def _get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=2.0, trust_env=False)
    except httpx.HTTPError:
        return None


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        """SIGKILL, as a crashed worker: no graceful close of its connections."""
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=10)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Upstream(Proc):
    worker_id: str = ""
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def entry(self, state: str = "ready") -> dict[str, str]:
        return {"id": self.worker_id, "url": self.url, "revision": "r1", "state": state}


@dataclass
class Router(Proc):
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def workers(self, headers: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
        response = httpx.get(f"{self.url}/admin/workers", headers=headers, timeout=5.0, trust_env=False)
        return {worker["id"]: worker for worker in response.json()["workers"]}

    def wait_rotation(self, expected: set[str], *, timeout: float = 20.0, headers=None) -> None:
        def check() -> bool:
            try:
                workers = self.workers(headers)
            except httpx.HTTPError:
                return False
            return {worker_id for worker_id, w in workers.items() if w["in_rotation"]} == expected

        wait_until(check, timeout=timeout, what=f"workers in rotation == {sorted(expected)}", log=self.log)

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=5.0, trust_env=False).text
        wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
        for line in text.splitlines():
            if line.startswith(f"{name}{{{wanted}}} ") or (not labels and line.startswith(f"{name} ")):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


@dataclass
class Cluster:
    """Starts processes for one test and stops them all at teardown."""

    tmp: Path
    procs: list[Proc] = field(default_factory=list)

    def _spawn(self, name: str, argv: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.tmp / f"{name}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with log.open("wb") as out:
            popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        return popen, log

    def upstream(self, worker_id: str, *, port: int | None = None) -> Upstream:
        port = port or free_port()
        popen, log = self._spawn(
            worker_id, [sys.executable, str(UPSTREAM), "--port", str(port), "--worker-id", worker_id]
        )
        proc = Upstream(name=worker_id, popen=popen, log=log, worker_id=worker_id, port=port)
        self.procs.append(proc)
        return proc

    def tiny_worker(
        self, worker_id: str, *, port: int | None = None, pipeline: str = "text", extra: tuple[str, ...] = ()
    ) -> Upstream:
        """A real `omni serve` worker on the tiny checkpoint (text pipeline by default, CPU); not
        waited for. `extra` adds flags."""
        port = port or free_port()
        argv = [
            sys.executable,
            "-m",
            "omni_operator.cli",
            "serve",
            "--pipeline",
            pipeline,
            "--device",
            "cpu",
            "--worker-id",
            worker_id,
            "--revision",
            "r1",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-batch-size",
            "4",
            "--log-level",
            "warning",
            *extra,
        ]
        popen, log = self._spawn(worker_id, argv)
        proc = Upstream(name=worker_id, popen=popen, log=log, worker_id=worker_id, port=port)
        self.procs.append(proc)
        return proc

    def upstreams(self, *worker_ids: str, wait: bool = True, port: int | None = None) -> list[Upstream]:
        procs = [self.upstream(worker_id, port=port) for worker_id in worker_ids]
        for proc in procs if wait else ():
            wait_until(
                lambda p=proc: (r := _get(f"{p.url}/ready")) is not None and r.status_code == 200,
                timeout=30,
                what=f"upstream {proc.worker_id}",
                log=proc.log,
            )
        return procs

    def write_workers(self, entries: list[dict[str, str]], name: str = "workers.json") -> Path:
        path = self.tmp / name
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"workers": entries}))
        temporary.replace(path)  # atomic, as `omni up` writes it
        return path

    def router(self, workers_file: Path, *extra: str, name: str = "router", wait: bool = True) -> Router:
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "omni_operator.cli",
            "router",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers-file",
            str(workers_file),
            "--health-interval",
            "0.2",
            *extra,
        ]
        popen, log = self._spawn(name, argv)
        proc = Router(name=name, popen=popen, log=log, port=port)
        self.procs.append(proc)
        if wait:
            wait_until(
                lambda: (r := _get(f"{proc.url}/health")) is not None and r.status_code == 200,
                timeout=30,
                what="router /health",
                log=log,
            )
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp=tmp_path)
    try:
        yield cluster
    finally:
        cluster.stop_all()


@pytest.fixture
def pair(cluster: Cluster) -> tuple[Router, list[Upstream]]:
    """Two upstream workers, w0 and w1, behind one router, both in rotation."""
    # Start everything at once: the router admits each worker when its /ready first answers 200.
    upstreams = cluster.upstreams("w0", "w1", wait=False)
    router = cluster.router(cluster.write_workers([u.entry() for u in upstreams]), wait=False)
    router.wait_rotation({"w0", "w1"}, timeout=40)
    return router, upstreams
