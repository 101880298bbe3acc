"""Text in, text out through real HTTP: non-streaming replies and per-token SSE streams."""

from __future__ import annotations

from api_sse import deltas, parse_sse

from conftest import Worker

HELLO = [{"role": "user", "content": "Hello there"}]


def test_text_reply_has_the_openai_shape(worker: Worker) -> None:
    with worker.client() as client:
        response = client.post(
            "/v1/chat/completions", json={"messages": HELLO, "max_tokens": 6, "ignore_eos": True}
        )
        model = client.get("/v1/models").json()["data"][0]["id"]
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-") and response.headers["x-request-id"] == body["id"]
    assert body["model"] == model
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
    assert choice["message"]["audio"] is None
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == 6
    assert usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + 6


def test_system_and_multi_turn_and_typed_text_parts(worker: Worker) -> None:
    messages = [
        {"role": "system", "content": "You are brief."},
        {"role": "user", "content": [{"type": "text", "text": "One"}, {"type": "text", "text": "Two"}]},
        {"role": "assistant", "content": "Three"},
        {"role": "user", "content": "Four"},
    ]
    with worker.client() as client:
        response = client.post(
            "/v1/chat/completions", json={"messages": messages, "max_tokens": 3, "model": None}
        )
    assert response.status_code == 200
    assert 1 <= response.json()["usage"]["completion_tokens"] <= 3


def test_stream_sends_per_token_deltas_then_finish_with_usage_then_done(worker: Worker) -> None:
    body = {"messages": HELLO, "max_tokens": 8, "ignore_eos": True, "stream": True}
    with worker.client() as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events, done = parse_sse(response.text)
    assert done
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert len({e["id"] for e in events}) == 1
    parts = deltas(events)
    assert parts[0] == {"role": "assistant", "content": ""}
    texts = [d["content"] for d in parts[1:] if d.get("content")]
    assert len(texts) >= 4  # token by token, not one aggregate chunk
    final = events[-1]
    assert final["choices"][0]["finish_reason"] == "length"
    assert final["usage"]["completion_tokens"] == 8
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])


def test_stream_include_usage_follows_openai(worker: Worker) -> None:
    body = {"messages": HELLO, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    with worker.client() as client:
        events, done = parse_sse(client.post("/v1/chat/completions", json=body).text)
    assert done
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] >= 1
    assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length") and events[-2]["usage"] is None


def test_non_streaming_and_streaming_text_agree_under_greedy_decoding(worker: Worker) -> None:
    base = {"messages": HELLO, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    with worker.client() as client:
        full = client.post("/v1/chat/completions", json=base).json()["choices"][0]["message"]["content"]
        events, _ = parse_sse(client.post("/v1/chat/completions", json={**base, "stream": True}).text)
    assert "".join(d.get("content") or "" for d in deltas(events)) == full
