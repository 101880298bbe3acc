"""Bad input found by an audit of the request parsing, each sent through the real API of the shared
speech worker (tiny checkpoint): every one is a 4xx with OpenAI error JSON naming the field, where
it was a 500 (a traceback in the log) before, or, for a huge ``top_k``, a failed thinker or talker
step that failed every request batched with it.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from conftest import SHORT_SPEECH, Worker

HELLO = [{"role": "user", "content": "Hi"}]
SPEECH = {"messages": HELLO, "max_tokens": 2, "modalities": ["text", "audio"]}
SESSIONS = "/v1/streaming_input/sessions"
TOO_DEEP = "[" * 100_000 + "]" * 100_000  # valid JSON, nested past what Python's parser recurses
HUGE = 10**400  # a JSON integer past float's range
HUGE_SHOWN = f"1{'0' * 29}...{'0' * 30} (401 characters)"  # elided in the message
IMAGE = "messages[0].content[0].image_url.url"


def _error(message: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


def _image(url: str) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
        "max_tokens": 2,
    }


def _talker(**params: Any) -> dict[str, Any]:
    return {**SPEECH, "stage_params": {"talker": {**SHORT_SPEECH["talker"], **params}}}


def _still_serves(client: httpx.Client) -> None:
    reply = client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2})
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            {"messages": HELLO, "max_tokens": 2, "top_k": 10**20},
            _error(
                "Invalid value for 'top_k': Input should be less than or equal to 2147483647.",
                "top_k",
                "invalid_value",
            ),
            id="top_k-past-int64",
        ),
        pytest.param(
            _talker(top_k=10**20),
            _error(
                "stage_params.talker.top_k must be a whole number >= 0 and <= 2147483647, not "
                "100000000000000000000",
                "stage_params.talker.top_k",
                None,
            ),
            id="talker-top_k-past-int64",
        ),
        pytest.param(
            _talker(temperature=HUGE),
            _error(
                f"stage_params.talker.temperature must be a number >= 0.0, not {HUGE_SHOWN}",
                "stage_params.talker.temperature",
                None,
            ),
            id="talker-temperature-past-float",
        ),
        pytest.param(
            _talker(top_p=HUGE),
            _error(
                f"stage_params.talker.top_p must be a number > 0.0 and <= 1.0, not {HUGE_SHOWN}",
                "stage_params.talker.top_p",
                None,
            ),
            id="talker-top_p-past-float",
        ),
        pytest.param(
            _image("file://[x/a.png"),
            _error(
                f"{IMAGE}: the file: URL is not valid (Invalid IPv6 URL); send file:///absolute/path or a "
                "plain path",
                IMAGE,
                "invalid_media",
            ),
            id="file-url-unclosed-bracket",
        ),
        pytest.param(
            _image("~nosuchuser-omni/a.png"),
            _error(
                f"{IMAGE}: ~nosuchuser-omni/a.png names the home directory of a user this worker does not "
                "have; send the file's full path",
                IMAGE,
                "invalid_media",
            ),
            id="path-of-unknown-user",
        ),
        pytest.param(
            _image("file:///tmp/a%00.png"),
            _error(
                f"{IMAGE}: the local path contains a NUL character, which no file name holds; send the "
                "file's path",
                IMAGE,
                "invalid_media",
            ),
            id="path-with-nul",
        ),
    ],
)
def test_chat_bad_input_is_a_400_naming_the_field(
    worker: Worker, body: dict[str, Any], expected: dict[str, Any]
) -> None:
    with worker.client() as client:
        reply = client.post("/v1/chat/completions", json=body)
        assert (reply.status_code, reply.json()) == (400, expected)
        _still_serves(client)


def test_a_path_too_long_for_the_file_system_is_a_400(worker: Worker) -> None:
    path = str(worker.media_dir / ("a" * 5000 + ".png"))
    with worker.client() as client:
        reply = client.post("/v1/chat/completions", json=_image(path))
        assert (reply.status_code, reply.json()) == (
            400,
            _error(
                f"{IMAGE}: {path} could not be read (File name too long); send the file as a data: URI",
                IMAGE,
                "invalid_media",
            ),
        )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("top_k", 10**20, "top_k: Input should be less than or equal to 2147483647"),
        # Infinity was accepted and the reply was noise; chat and the video socket stop at 2.0
        ("repetition_penalty", 1e308 * 10, "repetition_penalty: Input should be less than or equal to 2"),
    ],
)
def test_streaming_input_sampling_out_of_range_is_refused_at_creation(
    worker: Worker, field: str, value: Any, message: str
) -> None:
    body = {field: value, "first_chunk": {"sequence_id": 0, "text": "hi", "end_of_input": True}}
    with worker.client() as client:
        reply = client.post(SESSIONS, content=json.dumps(body), headers={"content-type": "application/json"})
        assert (reply.status_code, reply.json()) == (400, _error(message, field, "invalid_value"))


@pytest.mark.parametrize("where", ["create", "chunk", "ndjson"])
def test_streaming_input_json_nested_too_deep_is_invalid_json(worker: Worker, where: str) -> None:
    with worker.client() as client:
        if where == "create":
            reply = client.post(SESSIONS, content=TOO_DEEP, headers={"content-type": "application/json"})
            prefix = "the body is not valid JSON: "
        elif where == "chunk":
            session = client.post(SESSIONS, json={}).json()["session_id"]
            reply = client.post(f"{SESSIONS}/{session}/chunks", content=TOO_DEEP)
            prefix = "the body is not valid JSON: "
        else:
            lines = json.dumps({"max_tokens": 2}) + "\n" + TOO_DEEP + "\n"
            reply = client.post("/v1/chat/completions", content=lines, headers={"X-Streaming-Input": "true"})
            prefix = "line 2 is not valid JSON: "
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["message"].startswith(prefix + "maximum recursion depth exceeded"), error
        assert (error["type"], error["param"], error["code"]) == (
            "invalid_request_error",
            None,
            "invalid_json",
        )
        _still_serves(client)


def test_a_chat_body_nested_too_deep_is_invalid_json(worker: Worker) -> None:
    with worker.client() as client:
        reply = client.post(
            "/v1/chat/completions", content=TOO_DEEP.encode(), headers={"content-type": "application/json"}
        )
    assert (reply.status_code, reply.json()) == (
        400,
        _error(
            "The request body could not be parsed as JSON (not JSON, or nested too deep); send one JSON "
            'object, such as {"model": ..., "messages": [...]}.',
            None,
            "invalid_json",
        ),
    )
