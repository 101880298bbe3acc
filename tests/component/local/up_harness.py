"""Harness for the real `omni up` as a subprocess: free ports, a state dir in tmp, its output collected line by
line, waits with deadlines that fail with the output's tail, and a teardown that leaves no process.

Processes are found through the worker table (`pids` per worker) and, for the router, through
/proc's list of the supervisor's children, so nothing is matched by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[3]
OMNI = REPO / ".venv" / "bin" / "omni"

TEXT_SPEC = """\
apiVersion: omni.dev/v1alpha1
kind: OmniDeployment
metadata:
  name: {name}
spec:
  model:
    name: tiny-omni
    source:
{source}
    architecture: qwen2_5_omni
  runtime:
    extraArgs: {extra_args}
  pipeline: text
  workers: {workers}
  gpu:
    tier: cpu
  rollout:
{rollout}
"""


def text_spec(
    *,
    name: str = "up-test",
    workers: int = 2,
    extra_args: str = "[]",
    rollout: str = "",
    checkpoint: Path | None = None,
) -> str:
    """A text deployment of tiny CPU workers: the tiny source, or ``checkpoint`` as a hostPath source
    (a checkpoint directory on this machine)."""
    source = (
        "      type: tiny" if checkpoint is None else f"      type: hostPath\n      hostPath: {checkpoint}"
    )
    return TEXT_SPEC.format(
        name=name, workers=workers, extra_args=extra_args, rollout=rollout or "    maxSurge: 1", source=source
    )


def write_tiny_checkpoint(directory: Path) -> Path:
    """The tiny Qwen2.5-Omni checkpoint written by the real `omni tiny-checkpoint` into ``directory``."""
    subprocess.run(
        [str(OMNI), "tiny-checkpoint", str(directory)], check=True, capture_output=True, timeout=300
    )
    return directory


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_base_port(workers: int = 8) -> int:
    """A base port whose worker ports (base + 10 i + 1) are free for `workers` indices."""
    for _ in range(200):
        base = random.randrange(20000, 50000, 10)
        if all(_port_free(base + 10 * i + 1) for i in range(workers)):
            return base
    raise RuntimeError("no free port range for workers")


def children(pid: int) -> list[int]:
    """Every descendant of pid, from /proc (Linux)."""
    found: list[int] = []
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return found
    for child in map(int, text.split()):
        found += [child, *children(child)]
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes (its parent reaps it soon).
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return False
    return True


def wait_until(check: Callable[[], bool], *, timeout: float, what: str, tail: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n--- output tail ---\n{tail()}")


@dataclass
class OmniUp:
    """One `omni up` process and what it printed."""

    state_dir: Path
    router_port: int
    base_port: int
    popen: subprocess.Popen[str] | None = None
    lines: list[str] = field(default_factory=list)
    stamped: list[tuple[float, str]] = field(default_factory=list)  # (time.monotonic(), line)
    _reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    def argv(self, spec_file: Path | None) -> list[str]:
        argv = [str(OMNI), "up"]
        if spec_file is not None:
            argv += ["-f", str(spec_file)]
        return [
            *argv,
            "--port",
            str(self.router_port),
            "--base-port",
            str(self.base_port),
            "--state-dir",
            str(self.state_dir),
        ]

    def start(self, spec_file: Path | None) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.popen = subprocess.Popen(
            self.argv(spec_file),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            env=env,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen is not None and self.popen.stdout is not None
        for line in self.popen.stdout:
            self.stamped.append((time.monotonic(), line.rstrip("\n")))
            self.lines.append(line.rstrip("\n"))

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.lines[-n:])

    def supervisor_lines(self) -> list[str]:
        return [line.split("| ", 1)[1] for line in self.lines if re.match(r"^\s*omni up \| ", line)]

    def line_time(self, pattern: str) -> float | None:
        """When the first supervisor line matching pattern was read."""
        for at, line in self.stamped:
            if re.match(r"^\s*omni up \| ", line) and re.search(pattern, line.split("| ", 1)[1]):
                return at
        return None

    def wait_line(self, pattern: str, *, timeout: float) -> str:
        found: list[str] = []

        def check() -> bool:
            assert self.popen is not None
            found[:] = [line for line in self.supervisor_lines() if re.search(pattern, line)]
            if not found and self.popen.poll() is not None:
                raise AssertionError(f"omni up exited with {self.popen.returncode}\n{self.tail()}")
            return bool(found)

        wait_until(check, timeout=timeout, what=f"a line matching {pattern!r}", tail=self.tail)
        return found[0]

    def table(self) -> dict[str, dict[str, Any]]:
        document = json.loads((self.state_dir / "workers.json").read_text())
        return {row["id"]: row for row in document["workers"]}

    def router_workers(self) -> dict[str, dict[str, Any]]:
        response = httpx.get(f"{self.url}/admin/workers", timeout=5.0, trust_env=False)
        return {w["id"]: w for w in response.json()["workers"]}

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=5.0, trust_env=False).text
        wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
        for line in text.splitlines():
            if line.startswith(f"{name}{{{wanted}}} "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def rerun(self, spec_file: Path, *extra: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """A second `omni up -f` for the same state dir (hands the spec over, follows the rollout)."""
        return subprocess.run(
            [*self.argv(spec_file), *extra],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
            check=False,
        )

    def stop(self, sig: signal.Signals = signal.SIGINT, *, timeout: float = 60.0) -> int:
        assert self.popen is not None
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
        code = self.popen.wait(timeout=timeout)
        if self._reader is not None:
            self._reader.join(timeout=10)
        return code

    def cleanup(self) -> None:
        """Teardown: stop politely, then kill whatever is left (by pid, never by name)."""
        if self.popen is None:
            return
        pids = children(self.popen.pid)
        with contextlib.suppress(OSError, ValueError):
            pids += [pid for row in self.table().values() for pid in row.get("pids", [])]
        try:
            self.stop(timeout=40)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)
        for pid in pids:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
