"""Strict Server-Sent Events parsing for the chat stream: every event is `data: <json>` or [DONE]."""

from __future__ import annotations

import json
from typing import Any


def parse_sse(body: str) -> tuple[list[dict[str, Any]], bool]:
    """The JSON events in order, and whether the stream ended with `data: [DONE]` as its last event."""
    events: list[dict[str, Any]] = []
    done = False
    for raw in body.split("\n\n"):
        block = raw.strip("\n")
        if not block:
            continue
        assert not done, "an event came after [DONE]"
        assert block.startswith("data: "), f"not an SSE data event: {block[:80]!r}"
        payload = block[len("data: ") :]
        if payload == "[DONE]":
            done = True
            continue
        events.append(json.loads(payload))
    return events, done


def deltas(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["choices"][0]["delta"] for e in events if e.get("choices")]
