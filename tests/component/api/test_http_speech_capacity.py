"""Admission by speech capacity through the real API: a worker with --max-speech-streams 1.

One realtime session takes the only speech slot; then a chat completion with audio out gets 429
with the exact OpenAI error JSON, Retry-After and the capacity header (the `openai` client raises
RateLimitError), a second realtime session gets the `error` event and a 1013 close, text-only
requests still pass, and /metrics shows the limit, the slot in use and the refusals. When the
session ends its slot is free again, and a finished speech stream gives its slot back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from conftest import SHORT_SPEECH, Worker, make_engine, start_worker, tiny_settings
from omni_runtime.realtime import RealtimeSettings

SPEECH = {"modalities": ["text", "audio"], "audio": {"format": "wav"}, "stage_params": SHORT_SPEECH}
HELLO = [{"role": "user", "content": "Say something."}]
MESSAGE = (
    "this worker is at its limit of 1 concurrent speech streams (--max-speech-streams 1); "
    'retry in 1 s or on another worker, or ask for text only (modalities: ["text"])'
)


@pytest.fixture(scope="module")
def one_stream_worker(media_dir: Path, tiny_checkpoint: Path) -> Iterator[Worker]:
    yield from start_worker(
        engine=make_engine(tiny_checkpoint),
        settings=tiny_settings(tiny_checkpoint),
        media_dir=media_dir,
        realtime_settings=RealtimeSettings(max_speech_streams=1),
    )


def _metrics(worker: Worker) -> dict[str, float]:
    text = httpx.get(f"{worker.url}/metrics", timeout=10).text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("omni_speech_streams")
    }


def _wait_in_use(worker: Worker, expected: float) -> None:
    deadline = time.monotonic() + 30
    while _metrics(worker)["omni_speech_streams_in_use"] != expected:
        assert time.monotonic() < deadline, _metrics(worker)
        time.sleep(0.05)


def test_full_worker_refuses_speech_with_429_and_1013(one_stream_worker: Worker) -> None:
    worker = one_stream_worker
    ws_url = worker.url.replace("http://", "ws://") + "/v1/realtime"
    with connect(ws_url) as holder:
        assert json.loads(holder.recv(timeout=30))["type"] == "session.created"
        assert _metrics(worker)["omni_speech_streams_in_use"] == 1
        ready = httpx.get(f"{worker.url}/ready", timeout=10).json()
        assert ready["speech_streams"] == {"limit": 1, "in_use": 1}  # the report the router reads

        with worker.client() as client:
            refused = client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 4, **SPEECH})
            assert refused.status_code == 429
            assert refused.json() == {
                "error": {
                    "message": MESSAGE,
                    "type": "rate_limit_exceeded",
                    "param": None,
                    "code": "speech_capacity_reached",
                }
            }
            assert refused.headers["retry-after"] == "1"
            assert refused.headers["x-omni-capacity"] == "speech"
            streamed = client.post(
                "/v1/chat/completions", json={"messages": HELLO, "max_tokens": 4, "stream": True, **SPEECH}
            )
            assert streamed.status_code == 429  # refused before any byte of a stream
            text = client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 4})
            assert text.status_code == 200, text.text  # text only is not limited

        sdk = openai.OpenAI(base_url=f"{worker.url}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.RateLimitError) as caught:
            sdk.chat.completions.create(
                model="tiny",
                messages=HELLO,  # type: ignore[arg-type]
                max_tokens=4,
                modalities=["text", "audio"],
                audio={"format": "wav", "voice": "Chelsie"},  # type: ignore[typeddict-item]
            )
        assert caught.value.code == "speech_capacity_reached"

        with connect(ws_url) as second:
            event = json.loads(second.recv(timeout=30))
            assert event["type"] == "error"
            assert event["error"]["code"] == "speech_capacity_reached"
            assert event["error"]["message"] == MESSAGE
            with pytest.raises(ConnectionClosed) as closed:
                second.recv(timeout=30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
            assert second.response is not None and second.response.headers["x-omni-capacity"] == "speech"

        video_url = worker.url.replace("http://", "ws://") + "/v1/video/chat/stream"
        with connect(video_url) as video:  # a video session may speak: refused the same way
            event = json.loads(video.recv(timeout=30))
            assert (event["type"], event["error"]["code"]) == ("error", "speech_capacity_reached")
            with pytest.raises(ConnectionClosed) as closed:
                video.recv(timeout=30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013

        metrics = _metrics(worker)
        assert metrics['omni_speech_streams_refused_total{kind="video"}'] == 1
        assert metrics["omni_speech_streams_limit"] == 1
        assert metrics['omni_speech_streams_refused_total{kind="chat"}'] == 3
        assert metrics['omni_speech_streams_refused_total{kind="realtime"}'] == 1

    _wait_in_use(worker, 0)  # the session ended: its slot is free
    with worker.client() as client:
        body = {"messages": HELLO, "max_tokens": 4, "stream": True, **SPEECH}
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        assert any('"audio"' in line for line in lines)
        _wait_in_use(worker, 0)  # the finished stream gave its slot back
        ok = client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 4, **SPEECH})
        assert ok.status_code == 200, ok.text
    assert _metrics(worker)["omni_speech_streams_in_use"] == 0


def test_the_openapi_document_lists_the_429(one_stream_worker: Worker) -> None:
    doc = httpx.get(f"{one_stream_worker.url}/openapi.json", timeout=30).json()
    assert "429" in doc["paths"]["/v1/chat/completions"]["post"]["responses"]
