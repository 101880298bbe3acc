"""Chat requests with one ``X-Session-Id`` share the conversation KV: the official openai client
sees the reused prompt tokens as ``usage.prompt_tokens_details.cached_tokens``, and the answer is
the one a request without the header gets."""

from __future__ import annotations

import httpx
import openai

from conftest import Worker


def _client(worker: Worker) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{worker.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_second_turn_reuses_the_first_turns_kv(worker: Worker) -> None:
    client = _client(worker)
    model = client.models.list().data[0].id
    session = {"X-Session-Id": "chat-kv-1"}
    messages: list = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a colour."},
    ]
    first = client.chat.completions.create(
        model=model, messages=messages, max_tokens=6, temperature=0, extra_headers=session
    )
    assert first.usage is not None and first.usage.prompt_tokens_details is None  # nothing kept yet
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Another one."},
    ]
    second = client.chat.completions.create(
        model=model, messages=messages, max_tokens=6, temperature=0, extra_headers=session
    )
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and first.usage.prompt_tokens <= cached < second.usage.prompt_tokens
    plain = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0)
    assert plain.choices[0].message.content == second.choices[0].message.content


def test_an_overlong_session_header_is_a_400_naming_it(worker: Worker) -> None:
    with httpx.Client(base_url=worker.url, timeout=60) as http:
        model = http.get("/v1/models").json()["data"][0]["id"]
        response = http.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            headers={"X-Session-Id": "s" * 300},
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "X-Session-Id" and "at most 256" in error["message"]
