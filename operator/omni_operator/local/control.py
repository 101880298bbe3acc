"""How a second `omni up -f FILE` reaches the one already running: a unix socket in the state dir.

The running supervisor listens on `<state-dir>/control.sock` (mode 0600: only this user may hand
it a spec, since a spec names the commands it runs). A second invocation for the same state dir
connects, sends the new spec's YAML and prints what comes back: one JSON object per line,

    {"event": "accepted", "message": ...}      the spec was planned; a rollout or scale began
    {"event": "progress", "line": ...}         one rollout step (only with follow)
    {"event": "done", "ok": bool, "message": ...}   complete, paused, blocked or deadline exceeded
    {"event": "error", "message": ...}         the spec was refused (nothing changed)

The request is one line too: {"op": "apply", "file": name, "yaml": text, "follow": bool}.
`hand_over` is the second invocation's side, `ControlServer` the running one's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SOCKET_NAME = "control.sock"
# sun_path holds 108 bytes on Linux (104 on macOS); stay under both with the terminator.
MAX_SOCKET_PATH = 100
MAX_LINE = 4 * 1024 * 1024


class ControlError(RuntimeError):
    """The running instance could not be reached or answered nonsense."""


def socket_path(state_dir: Path) -> Path:
    return state_dir / SOCKET_NAME


def check_socket_path(state_dir: Path) -> Path:
    path = socket_path(state_dir)
    if len(str(path)) > MAX_SOCKET_PATH:
        raise ControlError(
            f"--state-dir {state_dir}: too long for the control socket ({len(str(path))} characters "
            f"with {SOCKET_NAME}, at most {MAX_SOCKET_PATH}); pick a shorter --state-dir"
        )
    return path


def connect(state_dir: Path, *, timeout: float = 5.0) -> socket.socket | None:
    """A connection to the `omni up` running for this state dir, or None when none runs.

    A socket file nobody answers on is left over from an instance that died without cleaning up;
    it is removed so the next instance can listen there.
    """
    path = socket_path(state_dir)
    if not path.exists() or len(str(path)) > MAX_SOCKET_PATH:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return None
    except OSError:
        sock.close()
        return None
    sock.settimeout(None)
    return sock


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message) + "\n").encode()


def hand_over(sock: socket.socket, *, file: str, text: str, follow: bool, out: Any = None) -> int:
    """Send a spec to the running instance and print its answers; the exit code of `omni up`.

    0: accepted (and, with follow, the rollout completed or paused); 1: the rollout stopped
    (deadline exceeded, blocked) or the instance went away; 2: the spec was refused.
    """
    out = out or sys.stdout
    with sock, sock.makefile("rb") as answers:
        sock.sendall(encode({"op": "apply", "file": file, "yaml": text, "follow": follow}))
        for raw in answers:
            try:
                message = json.loads(raw)
            except json.JSONDecodeError:
                raise ControlError(f"the running omni up answered {raw[:200]!r}") from None
            event = message.get("event")
            if event == "error":
                print(f"omni up: error: {message.get('message')}", file=sys.stderr)
                return 2
            if event == "accepted":
                print(f"omni up: {message.get('message')}", file=out, flush=True)
                if not follow:
                    return 0
            elif event == "progress":
                print(f"omni up: {message.get('line')}", file=out, flush=True)
            elif event == "done":
                print(f"omni up: {message.get('message')}", file=out, flush=True)
                return 0 if message.get("ok") else 1
    print("omni up: the running omni up stopped before the rollout finished", file=sys.stderr)
    return 1


def prepare_listen_path(state_dir: Path) -> Path:
    """The socket path to listen on; refuses when another instance already answers there."""
    path = check_socket_path(state_dir)
    live = connect(state_dir, timeout=2.0)
    if live is not None:
        live.close()
        raise ControlError(
            f"another omni up already runs for {state_dir}; run `omni up -f FILE` to hand it a new spec, "
            "or give this one its own --state-dir"
        )
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return path


def restrict(path: Path) -> None:
    os.chmod(path, 0o600)


@dataclass
class Follower:
    """A second `omni up` following the rollout it started (until the next spec or a final state)."""

    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)


class ControlServer:
    """The running side: takes specs for `apply`, fans rollout progress out to followers."""

    def __init__(self, *, apply: Callable[..., str], refused: tuple[type[Exception], ...]) -> None:
        self._apply = apply  # apply(text=..., file=...) -> message; raises one of `refused`
        self._refused = refused
        self._followers: list[Follower] = []
        self._server: asyncio.Server | None = None
        self._path: Path | None = None

    async def listen(self, state_dir: Path) -> None:
        self._path = prepare_listen_path(state_dir)
        self._server = await asyncio.start_unix_server(self.serve, path=str(self._path), limit=MAX_LINE)
        restrict(self._path)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    def remove(self) -> None:
        if self._path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._path.unlink()

    def progress(self, line: str) -> None:
        for follower in self._followers:
            follower.queue.put_nowait({"event": "progress", "line": line})

    def finish(self, *, ok: bool, message: str) -> None:
        for follower in self._followers:
            follower.queue.put_nowait({"event": "done", "ok": ok, "message": message})
        self._followers = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        follower: Follower | None = None
        try:
            request = json.loads(await reader.readline() or b"{}")
            if not isinstance(request, dict) or request.get("op") != "apply":
                writer.write(encode({"event": "error", "message": "unknown request"}))
                return
            try:
                message = self._apply(text=str(request.get("yaml", "")), file=str(request.get("file", "-")))
            except self._refused as err:
                writer.write(encode({"event": "error", "message": str(err)}))
                return
            if request.get("follow"):
                # Registered before the next await: no tick can finish the rollout unseen.
                follower = Follower()
                self._followers.append(follower)
            writer.write(encode({"event": "accepted", "message": message, "pid": os.getpid()}))
            await writer.drain()
            while follower is not None:
                event = await follower.queue.get()
                writer.write(encode(event))
                await writer.drain()
                if event["event"] == "done":
                    break
        except (ConnectionError, ValueError):
            pass  # a follower that went away (Ctrl-C) or sent garbage; the rollout goes on
        finally:
            if follower is not None and follower in self._followers:
                self._followers.remove(follower)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.close()
