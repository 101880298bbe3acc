"""Helpers for tests that run a real `omni serve` process: a free loopback port and its readiness."""

from __future__ import annotations

import socket

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ready", timeout=2, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False
