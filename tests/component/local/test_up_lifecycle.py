"""`omni up` with no -f, for real: two tiny-checkpoint workers and the router as processes.

One instance serves the whole module (starting two workers costs most of a minute on a small
CPU); the tests run in file order and the last one stops it with Ctrl-C (SIGINT).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from up_harness import OmniUp, alive, children, free_base_port, free_port, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

READY_S = 300.0  # two workers loading on a CPU shared with other jobs


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniUp]:
    instance = OmniUp(
        state_dir=tmp_path_factory.mktemp("up"), router_port=free_port(), base_port=free_base_port()
    )
    instance.start(None)  # the embedded default: two tiny workers, speech pipeline
    try:
        instance.wait_line(r"^ready: ", timeout=READY_S)
        yield instance
    finally:
        instance.cleanup()


def test_ready_line_names_the_endpoint_and_a_working_curl(up: OmniUp) -> None:
    ready = up.wait_line(r"^ready: ", timeout=1)
    assert ready == f"ready: 2 workers of 'tiny-omni' behind the router at {up.url}"
    example = up.wait_line(r"^try:  curl ", timeout=1)
    match = re.fullmatch(
        rf"try:  curl -s {re.escape(up.url)}(/v1/chat/completions) -H '[^']+' -d '(.+)'", example
    )
    assert match, example
    response = httpx.post(
        up.url + match.group(1), json=json.loads(match.group(2)), timeout=60, trust_env=False
    )
    assert response.status_code == 200, response.text
    assert response.json()["object"] == "chat.completion"

    table = up.table()
    assert sorted(table) == ["tiny-omni-w0", "tiny-omni-w1"]
    assert [row["state"] for row in table.values()] == ["ready", "ready"]
    assert table["tiny-omni-w0"]["url"] == f"http://127.0.0.1:{up.base_port + 1}"
    assert table["tiny-omni-w1"]["url"] == f"http://127.0.0.1:{up.base_port + 11}"
    assert all(len(row["pids"]) == 1 and alive(row["pids"][0]) for row in table.values())


def test_chat_through_the_router_with_the_openai_client(up: OmniUp) -> None:
    client = openai.OpenAI(base_url=f"{up.url}/v1", api_key="unused", max_retries=0, timeout=60)
    completion = client.chat.completions.create(
        model="tiny-omni", messages=[{"role": "user", "content": "Hello!"}], max_tokens=8
    )
    assert completion.model == "tiny-omni"
    assert isinstance(completion.choices[0].message.content, str)
    assert completion.usage is not None and 1 <= completion.usage.completion_tokens <= 8
    revisions = {row["revision"] for row in up.table().values()}
    assert completion.system_fingerprint in revisions


def test_sessions_spread_over_both_workers(up: OmniUp) -> None:
    workers = ["tiny-omni-w0", "tiny-omni-w1"]
    before = {w: up.metric("omni_router_requests_total", status="200", worker=w) for w in workers}
    with httpx.Client(base_url=up.url, timeout=60, trust_env=False) as client:
        for i in range(12):
            response = client.post(
                "/v1/chat/completions",
                json={"model": "tiny-omni", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                headers={"X-Session-Id": f"conversation-{i}"},
            )
            assert response.status_code == 200, response.text
    served = {w: up.metric("omni_router_requests_total", status="200", worker=w) - before[w] for w in workers}
    assert sum(served.values()) == 12
    assert all(count >= 1 for count in served.values()), served


def test_killed_worker_leaves_rotation_restarts_and_returns(up: OmniUp) -> None:
    (old_pid,) = up.table()["tiny-omni-w0"]["pids"]
    os.kill(old_pid, signal.SIGKILL)
    wait_until(
        lambda: up.table()["tiny-omni-w0"]["state"] == "starting",
        timeout=10,
        what="tiny-omni-w0 starting in the worker table",
        tail=up.tail,
    )
    wait_until(
        lambda: not up.router_workers()["tiny-omni-w0"]["in_rotation"],
        timeout=10,
        what="tiny-omni-w0 out of rotation",
        tail=up.tail,
    )
    # Meanwhile the other worker serves everything.
    with httpx.Client(base_url=up.url, timeout=60, trust_env=False) as client:
        for i in range(3):
            response = client.post(
                "/v1/chat/completions",
                json={"model": "tiny-omni", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                headers={"X-Session-Id": f"while-down-{i}"},
            )
            assert response.status_code == 200, response.text
    up.wait_line(r"^tiny-omni-w0/worker exited with code -9; restart #1 in 1s$", timeout=10)

    def back() -> bool:
        row = up.table()["tiny-omni-w0"]
        return (
            row["state"] == "ready"
            and row["pids"] != [old_pid]
            and up.router_workers()["tiny-omni-w0"]["in_rotation"]
        )

    wait_until(back, timeout=READY_S, what="tiny-omni-w0 ready and in rotation again", tail=up.tail)
    assert up.table()["tiny-omni-w1"]["state"] == "ready"


def test_a_1_mb_header_is_refused_and_everything_keeps_serving(up: OmniUp) -> None:
    with httpx.Client(base_url=up.url, timeout=60, trust_env=False) as client:
        refused = client.get("/v1/models", headers={"X-Session-Id": "s" * (1 << 20)})
        assert refused.status_code == 431
        assert refused.json()["error"]["code"] == "request_headers_too_large"
        assert client.get("/health").status_code == 200
        response = client.post(
            "/v1/chat/completions",
            json={"model": "tiny-omni", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            headers={"X-Session-Id": "after-the-big-one"},
        )
        assert response.status_code == 200, response.text
    # omni up still reads the router (its admin API on loopback) and still prints its output.
    assert all(w["in_rotation"] for w in up.router_workers().values())
    assert not [line for line in up.lines if "error: reading the output" in line]


def test_ctrl_c_stops_everything_cleanly(up: OmniUp) -> None:
    assert up.popen is not None
    pids = children(up.popen.pid)
    table_pids = [pid for row in up.table().values() for pid in row["pids"]]
    assert set(table_pids) <= set(pids)
    assert len(pids) >= 3  # two workers and the router
    started = time.monotonic()
    assert up.stop(signal.SIGINT, timeout=60) == 0
    assert time.monotonic() - started < 30
    wait_until(lambda: not any(alive(pid) for pid in pids), timeout=10, what="no process left", tail=up.tail)
    assert up.supervisor_lines()[-1] == "stopped"
    assert [row["state"] for row in up.table().values()] == ["gone", "gone"]
    assert not (up.state_dir / "control.sock").exists()
    assert not any("Traceback" in line for line in up.lines if line.lstrip().startswith("omni up |"))
    # Quiet consoles: no access line per probe (omni up probes /ready twice a second), and no
    # "nanobind: leaked ..." lines from the workers at Ctrl-C.
    assert not [line for line in up.lines if re.search(r'"GET /(ready|health) HTTP/1.1" 200', line)]
    assert not [line for line in up.lines if "leaked" in line]
