"""Health, readiness, the model card and metrics; `omni bench` and `omni serve` against real workers."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conftest import SHORT_SPEECH, Worker, free_port
from omni_runtime.bench.main import main as bench_main


def test_health_ready_and_model_card(worker: Worker) -> None:
    with worker.client() as client:
        assert client.get("/health").json() == {"status": "ok"}
        ready = client.get("/ready")
        models = client.get("/v1/models").json()
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    (card,) = models["data"]
    assert card["id"] == worker.engine.model_name and card["object"] == "model"
    meta = card["metadata"]
    assert meta["random_weights"] is True
    assert "RANDOM weights" in meta["note"]
    assert meta["output_modalities"] == ["text", "audio"] and meta["output_sample_rate"] == 24000
    assert meta["max_tokens_limit"] == 256


def _metric(text: str, pattern: str) -> float:
    match = re.search(rf"^{pattern} (\S+)$", text, re.MULTILINE)
    assert match, f"{pattern} missing"
    return float(match.group(1))


def test_metrics_count_requests_latencies_and_audio(worker: Worker) -> None:
    with worker.client() as client:
        before = client.get("/metrics").text
        client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}
        )
        client.post("/v1/chat/completions", json={"messages": [], "max_tokens": 3})
        # Seeded: unseeded sampling from random weights can now and then end a reply before its first audio.
        speech = {"modalities": ["text", "audio"], "stage_params": SHORT_SPEECH, "max_tokens": 3, "seed": 1}
        client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], **speech})
        after = client.get("/metrics").text
    ok = 'omni_requests_total{endpoint="/v1/chat/completions",status="200"}'
    bad = 'omni_requests_total{endpoint="/v1/chat/completions",status="400"}'
    assert _metric(after, re.escape(ok)) - (_metric(before, re.escape(ok)) if ok in before else 0) == 2
    assert _metric(after, re.escape(bad)) - (_metric(before, re.escape(bad)) if bad in before else 0) == 1
    for name in (
        "omni_time_to_first_token_seconds_count",
        "omni_time_to_first_audio_seconds_count",
        "omni_event_loop_lag_seconds_count",  # the lag watch wakes every 20 ms while the worker runs
    ):
        assert _metric(after, name) > _metric(before, name)
    for gauge in (
        "omni_queue_depth",
        "omni_running_batch_size",
        "omni_speech_replies",
        "omni_busy_first_windows_total",
        "omni_thinker_steps_total",
        "omni_thinker_steps_ahead_total",
        "omni_lingered_first_windows_total",
        "omni_first_window_linger_seconds_total",
        "omni_active_sessions",
        "omni_output_tokens_total",
    ):
        assert _metric(after, gauge) >= 0
    assert "omni_output_tokens_per_second_bucket" in after


def test_bench_against_the_worker(worker: Worker, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baseline = tmp_path / "hf.json"
    baseline.write_text(
        json.dumps(
            [{"label": "hf-generate", "concurrency": 1, "requests_per_s": 1.0, "output_tokens_per_s": 4.0}]
        )
    )
    argv = ["--url", worker.url, "--concurrency", "1,2", "--requests", "2", "--max-tokens", "4", "--stream"]
    speech = ["--mode", "speech", "--extra-body", json.dumps({"stage_params": SHORT_SPEECH})]
    assert bench_main([*argv, *speech, "--out", str(tmp_path), "--baseline-json", str(baseline)]) == 0
    out = capsys.readouterr()
    assert "hf-generate" in out.out and "concurrency 2: 2/2 requests" in out.err
    report = json.loads((tmp_path / "bench.json").read_text())
    assert [level["concurrency"] for level in report["levels"]] == [1, 2]
    for level in report["levels"]:
        assert level["failed"] == 0 and level["requests"] == 2
        assert level["output_tokens_per_s"] > 0
        assert level["ttft_p50_s"] is not None and level["ttfa_p50_s"] is not None
        assert level["ttft_p50_s"] <= level["latency_p50_s"]
    assert report["baselines"][0]["label"] == "hf-generate"
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_reports_an_unreachable_url(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert bench_main(["--url", url, "--requests", "1"]) == 1
    assert capsys.readouterr().err == (
        f"omni bench: cannot reach {url} (All connection attempts failed); start the worker or router first "
        "(omni up, omni serve) or fix --url\n"
    )


def test_omni_serve_end_to_end(tiny_checkpoint: Path) -> None:
    """The real command: starting (503), ready after warm-up, the start log line, SIGTERM exits 0."""
    port = free_port()
    env = {**os.environ, "OMNI_CACHE_DIR": str(tiny_checkpoint.parent)}
    command = [sys.executable, "-m", "omni_operator.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--device", "cpu", "--pipeline", "text", "--worker-id", "tiny-w0", "--revision", "r1",
               "--max-model-len", "512"]  # fmt: skip
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    statuses: list[str] = []
    early_chat: httpx.Response | None = None
    try:
        deadline = time.monotonic() + 300
        with httpx.Client(base_url=url, timeout=10) as client:
            while True:
                assert process.poll() is None, process.stdout.read() if process.stdout else ""
                assert time.monotonic() < deadline, "omni serve did not become ready"
                try:
                    ready = client.get("/ready")
                except httpx.TransportError:
                    time.sleep(0.1)
                    continue
                statuses.append(ready.json()["status"])
                if ready.status_code == 200:
                    break
                if early_chat is None:
                    early_chat = client.post(
                        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
                    )
                time.sleep(0.1)
            card = client.get("/v1/models").json()["data"][0]
            reply = client.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}
            )
            metrics = client.get("/metrics").text
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    assert statuses[0] == "starting" and statuses[-1] == "ready"
    if early_chat is not None and statuses[1:2] == ["starting"]:
        assert early_chat.status_code == 503 and early_chat.json()["error"]["code"] == "not_ready"
    assert card["id"] == "tiny" and card["metadata"]["random_weights"] is True
    assert card["metadata"]["worker_id"] == "tiny-w0" and card["metadata"]["revision"] == "r1"
    assert card["metadata"]["output_modalities"] == ["text"]
    assert reply.status_code == 200 and reply.json()["system_fingerprint"] == "r1"
    # Once ready, the startup heap is frozen out of full collections, and pauses are measured.
    frozen = re.search(r"^omni_gc_frozen_objects (\S+)$", metrics, re.M)
    assert frozen is not None and float(frozen.group(1)) > 10_000, metrics
    assert re.search(r'^omni_gc_pause_seconds_count\{generation="2"\} [1-9]', metrics, re.M), metrics
    assert "froze" in output and "startup objects out of the garbage collector's passes" in output
    assert f"{url} — try: curl -s {url}/v1/chat/completions" in output
