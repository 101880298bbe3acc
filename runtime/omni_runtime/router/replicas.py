"""`omni router --processes N`: N full router replicas in one process group, sharing one port.

One Python process proxies a few thousand requests per second; a many-core host can run several.
Each replica is a complete router (own worker table, health checks, upstream pools), which is
correct without shared state because routing needs none: session ids carry their worker, session
keys hash consistently over the same table, and everything else goes to the least-loaded worker as
one replica sees it.

The parent binds the port itself, first without SO_REUSEPORT (so a port already in use, even by
another reuse-port group, is a one-line error), then one SO_REUSEPORT listening socket per replica,
and hands each replica its socket; the kernel spreads new connections evenly over the sockets.
Holding the sockets in the parent means a replica that crashes is restarted on the same socket and
the connections that arrived meanwhile wait in its backlog instead of being refused. Replicas'
log lines reach the parent over pipes and go to stderr line by line, never interleaved mid-line.

What a replica cannot know alone: an admin drain over HTTP reaches one replica, and live-session
counts are per replica; so with N > 1 the admin drain endpoints answer 409 (drain through the
worker table instead) and --source kubernetes is refused (its drain reports are per pod). /metrics
is whole: each replica also listens on a private unix socket in a directory the parent owns, and
the replica a scrape reaches adds its siblings' series to its own (metrics_merge.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import IO

from omni_runtime.router.logs import timestamp

RESTART_DELAY_S = 1.0
STOP_GRACE_S = 15.0


class PortInUse(Exception):
    pass


def bind_group(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` listening SO_REUSEPORT sockets on host:port, or PortInUse when anything holds the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:  # no SO_REUSEPORT: fails if anyone holds it
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise PortInUse(f"--port {port}: cannot listen on {host}:{port}: {exc.strerror}") from None
    sockets = []
    for _ in range(count):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.set_inheritable(True)
        sockets.append(sock)
    return sockets


def replica_socket_path(directory: str, index: int) -> Path:
    return Path(directory) / f"replica-{index}.sock"


def bind_replica_socket(directory: str, index: int) -> socket.socket:
    """A replica's private listening socket (a restarted replica replaces its predecessor's)."""
    path = replica_socket_path(directory, index)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    path.chmod(0o600)
    sock.listen(64)
    return sock


def _forward_lines(pipe: IO[bytes], lock: threading.Lock) -> None:
    out = sys.stderr.buffer
    for line in pipe:
        with lock:
            out.write(line)
            out.flush()


def watch_parent() -> None:
    """In a replica: stop (SIGTERM to itself) when the parent that started it is gone."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


class Replicas:
    """Starts the replicas, restarts one that dies, stops them all on SIGINT or SIGTERM."""

    def __init__(self, *, argv: list[str], sockets: list[socket.socket]) -> None:
        self.argv = argv  # the `omni router` flags, without --processes
        self.sockets = sockets
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * len(sockets)
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self.metrics_dir = tempfile.mkdtemp(prefix="omni-router-")  # mode 0700: this user only

    def _start(self, index: int) -> None:
        sock = self.sockets[index]
        argv = [sys.executable, "-m", "omni_runtime.router.main", *self.argv]
        argv += ["--replica-fd", str(sock.fileno()), "--replica", f"{index}/{len(self.sockets)}"]
        argv += ["--replica-metrics-dir", self.metrics_dir]
        # A session of its own: a terminal's Ctrl-C reaches only this parent, which stops the replicas
        # once (a second signal would make uvicorn skip its graceful shutdown). A replica whose
        # parent dies stops by itself (watch_parent).
        proc = subprocess.Popen(
            argv, pass_fds=(sock.fileno(),), stderr=subprocess.PIPE, start_new_session=True
        )
        assert proc.stderr is not None
        threading.Thread(target=_forward_lines, args=(proc.stderr, self._lock), daemon=True).start()
        self.procs[index] = proc

    def _log_line(self, level: str, msg: str, fields: dict[str, object]) -> None:
        """A JSON line like the replicas' own (logs.py), between their lines, never inside one."""
        line = {"ts": timestamp(time.time()), "level": level, "logger": "omni.router", "msg": msg, **fields}
        with self._lock:
            sys.stderr.buffer.write(json.dumps(line).encode() + b"\n")
            sys.stderr.buffer.flush()

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping.set()

    def run(self) -> int:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._stop)
        for index in range(len(self.sockets)):
            self._start(index)
        while not self.stopping.wait(0.2):
            for index, proc in enumerate(self.procs):
                if proc is not None and proc.poll() is not None and not self.stopping.is_set():
                    self._log_line(
                        "warning",
                        f"replica {index} exited with {proc.returncode}; restarting it",
                        {"event": "replica_restart", "replica": index, "exit_code": proc.returncode},
                    )
                    time.sleep(RESTART_DELAY_S)
                    self._start(index)
        return self.stop()

    def stop(self) -> int:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # uvicorn's graceful shutdown
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs:
            if proc is None:
                continue
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()
        shutil.rmtree(self.metrics_dir, ignore_errors=True)
        return 0
