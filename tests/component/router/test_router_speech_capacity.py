"""Two real speech workers (tiny checkpoint, CPU, --max-speech-streams 1) behind real `omni router`s:
a worker at its speech stream limit answers 429 / an error event with 1013, and the router sends
the new request or session to the other worker. One router probes rarely, so its view is stale and
the refusal itself moves the request (a retry); the other reads the full worker's /ready report
and ranks it last (no retry). When both are full the refusal reaches the client as the worker gave
it; text still flows."""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from conftest import Cluster, Router, wait_until
from omni_runtime.contract.sessions import worker_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

READY_S = 500.0  # two speech workers loading at once on a shared 2-core machine
HELLO = [{"role": "user", "content": "Say something."}]
SPEECH = {
    "messages": HELLO,
    "max_tokens": 4,
    "modalities": ["text", "audio"],
    "audio": {"format": "wav"},
    "stage_params": {"talker": {"max_tokens": 20}},
}


def _session_worker(ws) -> str | None:  # type: ignore[no-untyped-def]
    event = json.loads(ws.recv(timeout=60))
    assert event["type"] == "session.created", event
    return worker_of(event["session"]["id"])


def _ready_body(url: str) -> dict[str, object] | None:
    try:
        response = httpx.get(f"{url}/ready", timeout=5, trust_env=False)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None  # type: ignore[no-any-return]


def _speech(router: Router) -> httpx.Response:
    with httpx.Client(base_url=router.url, timeout=120, trust_env=False) as client:
        return client.post("/v1/chat/completions", json=SPEECH)


def test_router_moves_a_new_speech_session_off_a_full_worker(cluster: Cluster) -> None:
    from omni_runtime.models.qwen2_5_omni.tiny import ensure_tiny_checkpoint

    ensure_tiny_checkpoint(progress=False)
    flags = ("--max-speech-streams", "1", "--max-batch-size", "4")
    w0, w1 = (cluster.tiny_worker(w, pipeline="streaming-speech", extra=flags) for w in ("sp-w0", "sp-w1"))
    for worker in (w0, w1):
        wait_until(
            lambda w=worker: _ready_body(w.url) is not None, timeout=READY_S, what=worker.name, log=worker.log
        )
    workers = cluster.write_workers([w0.entry(), w1.entry()])
    # Probes once at start (both ready, both free) and then not for minutes: a stale view.
    stale = cluster.router(workers, "--health-interval", "300", name="router-stale")
    live = cluster.router(workers, "--health-interval", "0.2", name="router-live")
    for router in (stale, live):
        router.wait_rotation({"sp-w0", "sp-w1"})

    # Fill sp-w0 behind the routers' backs.
    with connect(f"ws://127.0.0.1:{w0.port}/v1/realtime") as holder:
        assert _session_worker(holder) == "sp-w0"
        report = _ready_body(w0.url)
        assert report is not None and report["speech_streams"] == {"limit": 1, "in_use": 1}

        # The stale router still ranks sp-w0 first (fewest sessions, then id): the 429 moves it.
        response = _speech(stale)
        assert response.status_code == 200, response.text
        assert response.headers["x-omni-worker"] == "sp-w1"
        assert response.json()["choices"][0]["message"]["audio"]["data"]
        assert stale.metric("omni_router_retries_total", worker="sp-w0") == 1

        # The live router read sp-w0's report and goes to sp-w1 straight away.
        # Its view right before the request: sp-w0 full, sp-w1 free and in rotation (on a loaded
        # machine a slow probe can take sp-w1 out for a moment; then the 429 path would serve it).
        def view_settled() -> bool:
            table = live.workers()
            return (
                table["sp-w0"]["speech_full"]
                and table["sp-w1"]["in_rotation"]
                and not table["sp-w1"]["speech_full"]
            )

        wait_until(view_settled, timeout=30, what="report", log=live.log)
        response = _speech(live)
        assert response.status_code == 200, response.text
        assert response.headers["x-omni-worker"] == "sp-w1"
        assert live.metric("omni_router_retries_total", worker="sp-w0") == 0

        # A new realtime session: sp-w0 refuses at the handshake, the router opens it on sp-w1.
        with connect(f"{stale.ws}/v1/realtime") as session:
            assert _session_worker(session) == "sp-w1"
            assert stale.metric("omni_router_retries_total", worker="sp-w0") == 2

            # Both full now: the worker's refusal reaches the client as it is.
            refused = _speech(stale)
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == "speech_capacity_reached"
            assert refused.headers["retry-after"] == "1"
            with httpx.Client(base_url=stale.url, timeout=120, trust_env=False) as client:
                text = client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 4})
                assert text.status_code == 200, text.text  # text is not limited
            with connect(f"{stale.ws}/v1/realtime") as third:
                event = json.loads(third.recv(timeout=60))
                assert event["type"] == "error" and event["error"]["code"] == "speech_capacity_reached"
                with pytest.raises(ConnectionClosed) as closed:
                    third.recv(timeout=60)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
