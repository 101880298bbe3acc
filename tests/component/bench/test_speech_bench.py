"""`omni bench --mode speech` against a real `omni serve` worker (tiny checkpoint, CPU), briefly:
a closed-loop and an open-loop run, each stream's audio timeline played back into the listener's
numbers (TTFA percentiles, underrun per stream, RTF, real-time streams, audio seconds per second),
written to bench.json with the speech plot. The worker admits two speech streams
(--max-speech-streams 2): a level past that counts the 429 refusals apart from failures."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SHORT_TALKER = '{"stage_params": {"talker": {"max_tokens": 30}}}'  # ~0.6 s of audio per reply


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def worker_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from omni_runtime.models.qwen2_5_omni.tiny import ensure_tiny_checkpoint

    ensure_tiny_checkpoint(progress=False)
    port = _free_port()
    log = tmp_path_factory.mktemp("speech-bench") / "serve.log"
    argv = [sys.executable, "-m", "omni_operator.cli", "serve", "--device", "cpu", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--pipeline", "streaming-speech", "--log-level", "warning"]
    argv += ["--max-speech-streams", "2"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(f"{url}/ready", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            raise AssertionError(f"worker not ready\n{log.read_text()[-3000:]}")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _bench(url: str, out: Path, *load: str) -> dict[str, object]:
    from omni_runtime.bench.main import main

    argv = ["--url", url, "--mode", "speech", "--stream", "--max-tokens", "4", "--warmup", "1"]
    argv += ["--extra-body", SHORT_TALKER, "--out", str(out), *load]
    assert main(argv) == 0
    assert (out / "speech.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result: dict[str, object] = json.loads((out / "bench.json").read_text())
    return result


def _check_listener_numbers(row: dict[str, float]) -> None:
    assert row["failed"] == row["refused"]
    assert row["audio_streams"] == row["requests"] - row["refused"] > 0
    assert 0 <= row["realtime_streams"] <= row["audio_streams"]
    assert 0 < row["ttfa_p50_s"] <= row["ttfa_p95_s"] <= row["ttfa_p99_s"] <= row["latency_p95_s"] * 1.0001
    assert 0 <= row["stall_mean_s"] <= row["stall_p95_s"] <= row["stall_max_s"]
    # a stream with no stall counts as real time: all real time means no stall at all
    assert (row["stall_max_s"] == 0) == (row["realtime_streams"] == row["audio_streams"])
    assert 0 < row["rtf_p50"] <= row["rtf_max"]
    assert row["audio_s_per_s"] > 0


def test_closed_loop_speech_levels(
    worker_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = _bench(worker_url, tmp_path, "--concurrency", "1,2", "--requests", "2")
    levels = result["levels"]
    # The worker's own account of each level, from its /metrics before and after: every reply's
    # first audio split into the engine's phases, which add up to less than what the client saw.
    from omni_runtime.contract.engine import FIRST_AUDIO_PHASES

    printed = capsys.readouterr().out
    assert f"the worker's {worker_url}/metrics" in printed
    for row in levels:  # type: ignore[union-attr]
        phases = row["worker"]["first_audio_phases"]
        assert list(phases) == sorted(FIRST_AUDIO_PHASES) and {p["n"] for p in phases.values()} == {2}
        inside = sum(p["mean_s"] for p in phases.values())
        assert 0 < inside < row["ttfa_mean_s"]
        assert row["worker"]["stages"]["talker"] > 0 and row["worker"]["stages"]["vocoder"] > 0
        lag = row["worker"]["loop_lag"]  # the worker's event loop woke every 20 ms meanwhile
        assert lag["n"] > 0 and lag["mean_s"] >= 0 and 0 <= lag["over_0.01s"] <= 1, lag
        assert f"  {row['concurrency']}: worker prompt " in printed
        assert f"of {lag['n']} wakes over 10 ms" in printed
    assert isinstance(levels, list) and [row["concurrency"] for row in levels] == [1, 2]
    for row in levels:
        assert row["rate_per_s"] is None
        assert row["refused"] == 0  # within the worker's two streams
        _check_listener_numbers(row)
    # One row per request, in the order sent; the level's worst stall is one of its requests'.
    rows = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert [r["level"] for r in rows] == ["c=1", "c=1", "c=2", "c=2"]
    for level, row in zip(("c=1", "c=2"), levels, strict=True):
        mine = [r for r in rows if r["level"] == level]
        sent = [r["sent_s"] for r in mine]
        assert sent == sorted(sent) and sent[0] < 0.05  # the first goes out at the level's start
        assert all(r["ok"] and r["ttfa_s"] > 0 and r["audio_s"] > 0 for r in mine)
        assert max(r["stall_s"] for r in mine) == pytest.approx(row["stall_max_s"], abs=1e-4)


def test_open_loop_speech_level(worker_url: str, tmp_path: Path) -> None:
    result = _bench(worker_url, tmp_path, "--rate", "2", "--duration", "1.5", "--seed", "3")
    (row,) = result["levels"]  # type: ignore[misc]
    from omni_runtime.bench.load import poisson_arrivals

    assert row["rate_per_s"] == 2.0
    assert row["requests"] == len(poisson_arrivals(2.0, 1.5, seed=3))
    assert row["concurrency"] >= 1  # the most requests in flight at once
    rows = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    arrivals = poisson_arrivals(2.0, 1.5, seed=3)
    assert len(rows) == len(arrivals) and {r["level"] for r in rows} == {"2/s"}
    for r, at in zip(rows, arrivals, strict=True):  # each sent at its arrival time, not before
        assert at - 1e-3 <= r["sent_s"] < at + 0.5
    _check_listener_numbers(row)
    assert result["meta"]["seed"] == 3  # type: ignore[index]


def test_refusals_past_the_worker_capacity_are_counted(worker_url: str, tmp_path: Path) -> None:
    # Four streams sent at once to a worker that admits two: the other two are refused at once.
    result = _bench(worker_url, tmp_path, "--concurrency", "4", "--requests", "4")
    (row,) = result["levels"]  # type: ignore[misc]
    assert row["refused"] >= 1
    assert row["first_error"].startswith("HTTP 429: ")
    assert "speech_capacity_reached" in row["first_error"]
    _check_listener_numbers(row)


def test_the_realtime_probe_splits_each_turn_into_its_phases(worker_url: str) -> None:
    """`bench.realtime_latency` on the same worker: two spoken turns on one session, each timed
    from the end of speech to response.created, to the reply's first text and to its first audio,
    in that order; the second turn's prompt carries the first turn."""
    import asyncio

    from omni_runtime.bench.realtime_latency import Probe, measure, synthetic_speech

    url = worker_url.replace("http://", "ws://") + "/v1/realtime"
    probe = Probe(
        url=url,
        speech=synthetic_speech(0.8),
        turns=2,
        max_output_tokens=6,
        timeout_s=300,
        metrics_url=worker_url + "/metrics",
    )
    result = asyncio.run(measure(probe, concurrency=1))
    assert result["samples"] == 2
    # The worker's own stage counters over the round: the thinker worked, no stage above 100%.
    stages = result["stages"]
    assert stages["thinker"] > 0 and all(0 < share <= 1.0 for share in stages.values()), stages
    # What waited for those stages: both turns' thinker admissions, and turn 2's history warm-up
    # (realtime/session/warmup.py) when the thinker took it before the response settled it (on a
    # busy machine it can be); every wait has its mean.
    waits = result["waits"]
    assert waits["thinker/admission"]["n"] in (2, 3), waits
    assert all(w["n"] > 0 and w["mean_s"] >= 0 and 0 <= w["over_0.1s"] <= 1 for w in waits.values()), waits
    assert result["loop_lag"]["n"] > 0, result["loop_lag"]  # the round's event loop lag
    # The worker's own split of each reply's way to first audio: every phase once per reply with audio.
    heard = sum(1 for row in result["by_turn"] if row["median_s"] is not None)
    phases = result["first_audio_phases"]
    if heard:
        assert set(phases) == {
            "prompt",
            "first_token",
            "talker_first_code",
            "first_window_codes",
            "first_window",
        }, phases
        assert all(p["n"] == heard for p in phases.values()), phases
    rows = result["by_turn"]
    assert [r["turn_index"] for r in rows] == [1, 2]
    assert rows[1]["input_tokens"] > rows[0]["input_tokens"] > 0
    for row in rows:
        if row["median_s"] is not None:  # a random talker may end a reply without audio
            assert 0 < row["created_s"] <= row["first_text_s"] <= row["median_s"]
        else:
            assert row["created_s"] > 0
    phases = result["phases"]
    assert 0 < phases["created_s"] <= phases["first_text_s"]
