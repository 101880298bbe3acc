"""A real `omni serve` (tiny checkpoint, CPU) on a console: probes leave no access-log line while
requests do, a 1 MB header is answered 431 without harm, and Ctrl-C (SIGINT) ends it with exit
code 0 and no "nanobind: leaked" noise."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from serve_process import free_port, ready

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

REPO = Path(__file__).resolve().parents[3]
READY_S = 300.0


def test_probes_are_quiet_and_ctrl_c_is_clean(tmp_path: Path) -> None:
    from omni_runtime.models.qwen2_5_omni.tiny import ensure_tiny_checkpoint

    ensure_tiny_checkpoint(progress=False)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    argv = [sys.executable, "-m", "omni_operator.cli", "serve", "--pipeline", "text", "--device", "cpu",
            "--host", "127.0.0.1", "--port", str(port), "--max-batch-size", "2"]  # fmt: skip
    with out.open("wb") as stdout, err.open("wb") as stderr:
        popen = subprocess.Popen(argv, stdout=stdout, stderr=stderr, cwd=REPO, env={**os.environ})
    try:
        deadline = time.monotonic() + READY_S
        while not ready(url):
            assert popen.poll() is None, err.read_text()[-3000:]
            assert time.monotonic() < deadline, err.read_text()[-3000:]
            time.sleep(0.5)
        with httpx.Client(base_url=url, trust_env=False, timeout=60) as client:
            huge = client.post("/v1/chat/completions", headers={"X-Session-Id": "x" * (1 << 20)}, json={})
            assert huge.status_code == 431, huge.text
            assert huge.json()["error"]["code"] == "request_headers_too_large", huge.text
        with httpx.Client(base_url=url, trust_env=False, timeout=60) as client:
            for _ in range(5):
                assert client.get("/ready").status_code == 200
                assert client.get("/health").status_code == 200
            chat = client.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            )
            assert chat.status_code == 200, chat.text
            assert client.get("/no-such-path").status_code == 404
        time.sleep(0.5)  # let the access lines reach the file
        popen.send_signal(signal.SIGINT)
        code = popen.wait(timeout=60)
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait(timeout=10)
    console = out.read_text() + err.read_text()
    access = [line.split(" - ", 1)[1] for line in console.splitlines() if " HTTP/1.1" in line]
    # Probes answered 503 while the worker loaded are still logged; successful ones are not.
    assert [
        line for line in access if line.startswith(('"GET /ready', '"GET /health')) and "503" not in line
    ] == []
    assert [line for line in access if not line.startswith(('"GET /ready', '"GET /health'))] == [
        '"POST /v1/chat/completions HTTP/1.1" 200 OK',
        '"GET /no-such-path HTTP/1.1" 404 Not Found',
    ]
    assert code == 0, console[-3000:]  # `omni serve` ends a Ctrl-C or SIGTERM stop with 0
    assert "leaked" not in console, [line for line in console.splitlines() if "leaked" in line][:5]
    assert "Traceback" not in console


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        (
            "OMNI_VOCODER_BUCKETS=2,16",
            "OMNI_VOCODER_BUCKETS is '2,16', not batch sizes in increasing order from 1 to 16",
        ),
        ("OMNI_VOCODER_FAR=soon", "OMNI_VOCODER_FAR is 'soon', not SECONDS,WINDOWS"),
        ("OMNI_BUSY_STREAMS=-1", "OMNI_BUSY_STREAMS is '-1', not a whole number of streams >= 0"),
        ("OMNI_PREFILL_GRAPHS=maybe", "OMNI_PREFILL_GRAPHS is 'maybe', not a flag; use 1 or 0"),
        ("OMNI_WARM_SPOKEN_AUDIO=maybe", "OMNI_WARM_SPOKEN_AUDIO is 'maybe', not a flag; use 1 or 0"),
        (
            "OMNI_SUFIX_GRAPHS=1",
            "OMNI_SUFIX_GRAPHS is not one of the builtin runtime's switches; did you mean",
        ),
    ],
)
def test_a_wrong_switch_stops_the_start_with_its_name_and_no_traceback(
    tmp_path: Path, setting: str, named: str
) -> None:
    from omni_runtime.models.qwen2_5_omni.tiny import ensure_tiny_checkpoint

    ensure_tiny_checkpoint(progress=False)
    name, value = setting.split("=", 1)
    argv = [sys.executable, "-m", "omni_operator.cli", "serve", "--pipeline", "streaming-speech", "--device",
            "cpu", "--host", "127.0.0.1", "--port", str(free_port()), "--max-batch-size", "2"]  # fmt: skip
    done = subprocess.run(
        argv, capture_output=True, text=True, cwd=REPO, env={**os.environ, name: value}, timeout=300
    )
    assert done.returncode == 2, done.stderr[-3000:]  # refused before loading, like a wrong flag
    assert f"omni serve: {named}" in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
