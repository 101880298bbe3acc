"""Hostile input against a real `omni serve` process (text pipeline, tiny checkpoint).

Each attack is answered fast with a 4xx and OpenAI error JSON (or a WebSocket ``error`` event),
and the worker stays up, small and serving: its resident memory is read from /proc before and after.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from websockets.sync.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from served_worker import Served, serve

SI = "/v1/streaming_input/sessions"
HELLO = [{"role": "user", "content": "hi"}]
MAX_MODEL_LEN = 512  # served_worker's --max-model-len: prompts of at most 32 * 512 characters, 128 messages
SHORT_SPEECH = {"talker": {"max_tokens": 20}}
SURROGATE = '"\\ud800"'  # JSON text: a lone surrogate, as a client can spell it


@pytest.fixture(scope="module")
def served(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(tiny_checkpoint, tmp_path_factory.mktemp("hostile"), "--pipeline", "speech") as worker:
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


def post_raw(client: httpx.Client, path: str, body: str) -> httpx.Response:
    return client.post(path, content=body.encode(), headers={"content-type": "application/json"})


def realtime(served: Served, *events: str | dict[str, Any], until: tuple[str, ...]) -> list[dict[str, Any]]:
    """Send the events on a fresh /v1/realtime socket; the events received until one of ``until``
    has come once per event sent."""
    received: list[dict[str, Any]] = []
    with connect(served.url.replace("http", "ws") + "/v1/realtime", max_size=None) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
        for event in events:
            ws.send(event if isinstance(event, str) else json.dumps(event))
        while sum(e["type"] in until for e in received) < len(events):
            received.append(json.loads(ws.recv(timeout=30)))
    return received


def text_item(text_json: str) -> str:
    return (
        '{"type": "conversation.item.create", "item": {"type": "message", "role": "user", '
        f'"content": [{{"type": "input_text", "text": {text_json}}}]}}}}'
    )


# --- 5: lone surrogates -----------------------------------------------------------------------


def test_a_lone_surrogate_is_a_400_naming_the_field(served: Served, client: httpx.Client) -> None:
    chat = "/v1/chat/completions"
    plain = post_raw(client, chat, '{"messages": [{"role": "user", "content": ' + SURROGATE + "}]}")
    assert "surrogate" in assert_error(plain, 400, "messages[0].content", "invalid_value")["message"]
    part = post_raw(
        client,
        chat,
        '{"messages": [{"role": "user", "content": [{"type": "text", "text": ' + SURROGATE + "}]}]}",
    )
    assert_error(part, 400, "messages[0].content[0].text", "invalid_value")
    model = post_raw(
        client, chat, '{"model": ' + SURROGATE + ', "messages": [{"role": "user", "content": "x"}]}'
    )
    assert_error(model, 400, "model", "invalid_value")
    session = client.post(SI, json={}).json()["session_id"]
    chunk = post_raw(
        client, f"{SI}/{session}/chunks", '{"sequence_id": 0, "modality": "text", "text": ' + SURROGATE + "}"
    )
    assert_error(chunk, 400, "text", "invalid_value")
    events = realtime(served, text_item(SURROGATE), until=("error", "conversation.item.created"))
    (error,) = [e["error"] for e in events if e["type"] == "error"]
    assert (error["param"], error["code"]) == ("item.content[0].text", "invalid_value"), error
    still_serves(client)


# --- 6: prompts too large to tokenize ---------------------------------------------------------


def test_huge_prompts_are_refused_before_tokenizing(served: Served, client: httpx.Client) -> None:
    started = time.monotonic()
    big = client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 10_000_000}]}
    )
    assert_error(big, 400, "messages[0].content", "prompt_too_long")
    assert time.monotonic() - started < 3.0
    started = time.monotonic()
    many = client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}] * 100_000}
    )
    assert "at most 128" in assert_error(many, 400, "messages", "too_many_messages")["message"]
    assert time.monotonic() - started < 5.0
    session = client.post(SI, json={}).json()["session_id"]
    first = client.post(
        f"{SI}/{session}/chunks", json={"sequence_id": 0, "modality": "text", "text": "x" * 10_000}
    )
    assert first.status_code == 202, first.text
    second = client.post(
        f"{SI}/{session}/chunks", json={"sequence_id": 1, "modality": "text", "text": "x" * 10_000}
    )
    assert_error(second, 400, "chunks[1].text", "prompt_too_long")
    history = client.post(SI, json={"messages": [{"role": "user", "content": "x"}] * 200})
    assert_error(history, 400, "messages", "too_many_messages")
    events = realtime(
        served, text_item(json.dumps("x" * 1_000_000)), until=("error", "conversation.item.created")
    )
    (error,) = [e["error"] for e in events if e["type"] == "error"]
    assert (error["param"], error["code"]) == ("item.content[0].text", "prompt_too_long"), error
    still_serves(client)


# --- 7: strict request models -----------------------------------------------------------------


def test_loose_types_and_unsupported_fields_are_refused(client: httpx.Client) -> None:
    chat = "/v1/chat/completions"
    assert_error(
        client.post(chat, json={"messages": HELLO, "max_tokens": "4"}), 400, "max_tokens", "invalid_type"
    )
    assert_error(
        client.post(chat, json={"messages": HELLO, "temperature": "0"}), 400, "temperature", "invalid_type"
    )
    assert_error(client.post(chat, json={"messages": HELLO, "stream": "yes"}), 400, "stream", "invalid_type")
    refused = client.post(chat, json={"messages": HELLO, "response_format": {"type": "json_object"}})
    assert "response_format" in assert_error(refused, 400, "response_format", "unsupported_value")["message"]
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    assert_error(
        client.post(chat, json={"messages": HELLO, "response_format": schema}), 400, "response_format"
    )
    text = client.post(chat, json={"messages": HELLO, "max_tokens": 2, "response_format": {"type": "text"}})
    assert text.status_code == 200, text.text
    session = client.post(SI, json={"max_tokens": 2}).json()["session_id"]
    assert_error(
        client.post(f"{SI}/{session}/chunks", json={"sequence_id": "1", "modality": "text", "text": "x"}),
        400,
        "sequence_id",
    )
    both = client.post(
        f"{SI}/{session}/chunks", json={"sequence_id": 0, "modality": "text", "text": "x", "payload": "eA=="}
    )
    assert "not both" in assert_error(both, 400, "body")["message"]
    assert_error(client.post(SI, json={"max_tokens": "4"}), 400, "max_tokens")
    client.post(
        f"{SI}/{session}/chunks",
        json={"sequence_id": 0, "modality": "text", "text": "x", "end_of_input": True},
    )
    assert_error(client.get(f"{SI}/{session}/result", params={"wait": "1e9"}), 400, "wait", "invalid_value")
    assert_error(client.get(f"{SI}/{session}/result", params={"wait": "nan"}), 400, "wait")
    waited = client.get(f"{SI}/{session}/result", params={"wait": "60"})
    assert waited.status_code == 200, waited.text


def test_the_openai_client_still_gets_through(served: Served) -> None:
    api = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
    reply = api.chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_tokens=3,
        temperature=0,
        top_p=1,
        seed=1,
        stop=["\n"],
        response_format={"type": "text"},
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "wav"},
        extra_body={"stage_params": SHORT_SPEECH},
    )
    assert reply.choices[0].message.audio is not None
    with pytest.raises(openai.BadRequestError) as refused:
        api.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Hi"}],
            response_format={"type": "json_object"},
        )
    assert refused.value.body["param"] == "response_format"  # type: ignore[index]


def test_the_openapi_document_says_what_the_routes_answer(client: httpx.Client) -> None:
    doc = client.get("/openapi.json").json()
    si = doc["paths"]["/v1/streaming_input/sessions/{session_id}/chunks"]["post"]["responses"]
    assert {"404", "409", "413", "400"} <= set(si)
    result = doc["paths"]["/v1/streaming_input/sessions/{session_id}/result"]["get"]
    assert {"404", "409"} <= set(result["responses"])
    (wait,) = [p["schema"]["anyOf"][0] for p in result["parameters"] if p["name"] == "wait"]
    assert (wait["minimum"], wait["maximum"]) == (0.0, 300.0)
    stream = doc["paths"]["/v1/streaming_input/sessions/{session_id}/stream"]["get"]["responses"]
    assert "text/event-stream" in stream["200"]["content"] and "404" in stream
    chat = doc["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert {"application/json", "text/event-stream"} <= set(chat)
    metrics = doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert [kind.split(";")[0] for kind in metrics] == ["text/plain"]
    assert not [path for path, ops in doc["paths"].items() for op in ops.values() if "422" in op["responses"]]


# --- 11: voices -------------------------------------------------------------------------------


def test_openai_voice_names_map_onto_the_model_and_others_are_refused(
    served: Served, client: httpx.Client
) -> None:
    speech = {
        "messages": HELLO,
        "max_tokens": 2,
        "modalities": ["text", "audio"],
        "stage_params": SHORT_SPEECH,
    }
    for voice in ("alloy", "echo", "Chelsie", "ethan"):
        reply = client.post("/v1/chat/completions", json={**speech, "audio": {"voice": voice}})
        assert reply.status_code == 200, (voice, reply.text)
    unknown = client.post("/v1/chat/completions", json={**speech, "audio": {"voice": "Nobody"}})
    assert "available: Chelsie, Ethan" in assert_error(unknown, 400, "audio.voice")["message"]
    assert_error(client.post(SI, json={"voice": "Nobody"}), 400, "voice", "invalid_value")
    assert_error(client.post(SI, json={"audio": {"voice": "Nobody"}}), 400, "audio.voice", "invalid_value")
    assert_error(client.post(SI, json={"audio": {"voice": 7}}), 400, "audio.voice")
    assert client.post(SI, json={"voice": "shimmer", "modalities": ["text", "audio"]}).status_code == 200
    events = realtime(
        served,
        {"type": "session.update", "session": {"audio": {"output": {"voice": "Nobody"}}}},
        {"type": "session.update", "session": {"audio": {"output": {"voice": "verse"}}}},
        until=("error", "session.updated"),
    )
    (error,) = [e["error"] for e in events if e["type"] == "error"]
    assert error["param"] == "session.audio.output.voice" and "Chelsie, Ethan" in error["message"]
    (updated,) = [e for e in events if e["type"] == "session.updated"]
    assert updated["session"]["audio"]["output"]["voice"] == "verse"
