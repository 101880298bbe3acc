"""Hostile input against a real `omni serve` process (text pipeline, tiny checkpoint).

Each attack is answered fast with a 4xx and OpenAI error JSON (or a WebSocket ``error`` event),
and the worker stays up, small and serving: its resident memory is read from /proc before and after.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from served_worker import Served, serve

SI = "/v1/streaming_input/sessions"
HELLO = [{"role": "user", "content": "hi"}]
MAX_MODEL_LEN = 512  # served_worker's --max-model-len


@pytest.fixture(scope="module")
def served(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(tiny_checkpoint, tmp_path_factory.mktemp("hostile")) as worker:
        yield worker


@pytest.fixture
def client(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, timeout=30) as http:
        yield http
    assert served.process.poll() is None, served.output()


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def assert_error(response: httpx.Response, status: int, param: str | None, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}, error
    assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


def still_serves(client: httpx.Client) -> None:
    reply = client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2})
    assert reply.status_code == 200, reply.text


# --- 1: a far sequence id ---------------------------------------------------------------------


def test_a_far_sequence_id_is_refused_in_milliseconds_with_memory_flat(
    served: Served, client: httpx.Client
) -> None:
    session = client.post(SI, json={}).json()["session_id"]
    before = rss_bytes(served.process.pid)
    started = time.monotonic()
    far = client.post(
        f"{SI}/{session}/chunks", json={"sequence_id": 1_000_000_000, "modality": "text", "text": "x"}
    )
    refused_after = time.monotonic() - started
    error = assert_error(far, 400, "sequence_id", "sequence_id_out_of_window")
    assert "sequence window" in error["message"], error
    finish = client.post(f"{SI}/{session}/finish")
    elapsed = time.monotonic() - started
    after = rss_bytes(served.process.pid)
    assert finish.status_code == 200, finish.text
    assert refused_after < 0.5 and elapsed < 2.0, (refused_after, elapsed)
    assert after - before < 64 * 1024 * 1024, (before, after)
    # The farthest id the window allows, then finish: the gap is counted, not listed.
    session = client.post(SI, json={}).json()["session_id"]
    edge = client.post(f"{SI}/{session}/chunks", json={"sequence_id": 4095, "modality": "text", "text": "x"})
    assert edge.status_code == 202, edge.text
    status = client.post(f"{SI}/{session}/finish").json()
    assert status["missing_count"] == 4095 and status["missing"] == list(range(100))
    assert rss_bytes(served.process.pid) - before < 64 * 1024 * 1024
    still_serves(client)
