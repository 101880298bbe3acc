"""Does the router pass answers through unchanged? One answer of each kind fetched both ways, compared.

Ids, timestamps and generated text differ between any two answers, so answers are compared by
shape: the nesting of keys and the types of values. A streamed answer is compared event by event
(with greedy decoding and EOS ignored both streams have the same number of chunks), a realtime
exchange by the events it produced.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def shape(value: Any) -> Any:
    """The structure of a JSON value: keys and value types, not the values themselves."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        return [shape(item) for item in value]
    return type(value).__name__


def _chat(base_url: str, body: dict[str, Any]) -> Any:
    import httpx

    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=300, trust_env=False)
    return {"status": response.status_code, "body": shape(response.json())}


def _stream(base_url: str, body: dict[str, Any]) -> Any:
    import httpx

    events: list[Any] = []
    with httpx.stream(
        "POST", f"{base_url}/v1/chat/completions", json=body, timeout=300, trust_env=False
    ) as response:
        status = response.status_code
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append(data if data == "[DONE]" else shape(json.loads(data)))
    return {"status": status, "events": events}


def _realtime(base_url: str, event: str) -> Any:
    from websockets.sync.client import connect

    url = "ws" + base_url[4:] + "/v1/realtime"
    with connect(url, proxy=None, open_timeout=60) as ws:
        created = json.loads(ws.recv(timeout=60))
        ws.send(event)
        reply = json.loads(ws.recv(timeout=60))
    return [shape(created), shape(reply)]


def compare_shapes(
    *,
    direct: str,
    routed: str,
    chat: Callable[[bool], dict[str, Any]],
    realtime_event: str | None,
) -> tuple[dict[str, bool], dict[str, dict[str, Any]]]:
    """Per case, whether the answer through the router has the direct answer's shape; and for each
    case that differs, both shapes (so a mismatch can be read, not only counted)."""
    checks: dict[str, Callable[[str], Any]] = {
        "chat": lambda url: _chat(url, chat(False)),
        "chat_stream": lambda url: _stream(url, chat(True)),
    }
    if realtime_event is not None:
        checks["ws_realtime"] = lambda url: _realtime(url, realtime_event)
    matches: dict[str, bool] = {}
    differences: dict[str, dict[str, Any]] = {}
    for case, fetch in checks.items():
        both = {"direct": fetch(direct), "routed": fetch(routed)}
        matches[case] = both["direct"] == both["routed"]
        if not matches[case]:
            differences[case] = both
    return matches, differences
