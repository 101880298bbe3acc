"""Which protocol a /v1/realtime socket speaks: the OpenAI Realtime API or vLLM-Omni's transcription flow.

Both dialects share one endpoint. A client may say which it speaks with ``?protocol=openai`` or
``?protocol=vllm``; otherwise the first client event decides (`pick_dialect`). Only events that a
working OpenAI client never sends first select the vLLM dialect: a flat ``session.update`` (a
top-level ``model`` and no ``session`` object), or an ``input_audio_buffer.commit`` before any audio
(OpenAI refuses an empty commit; vLLM's flow starts with one). Anything else, an append included,
stays OpenAI, so a vLLM client that appends before its first commit must name its protocol.
"""

from __future__ import annotations

import json
from typing import Literal

from omni_runtime.realtime.errors import invalid

Dialect = Literal["openai", "vllm"]
PROTOCOL_PARAM = "protocol"
DIALECTS: tuple[Dialect, ...] = ("openai", "vllm")


def requested_dialect(value: str | None, *, duplex: bool) -> Dialect | None:
    """The dialect named by the ``protocol`` query parameter; None: decide from the first event."""
    if value is None or value in ("", "auto"):
        return "openai" if duplex else None
    if value not in DIALECTS:
        raise invalid(PROTOCOL_PARAM, f"unknown protocol {value!r}; use openai, vllm or auto (the default)")
    if value == "vllm" and duplex:
        raise invalid(
            PROTOCOL_PARAM,
            "duplex sessions (duplex=1, or a resume by session_id) speak the OpenAI dialect; "
            "drop protocol=vllm or the duplex parameters",
        )
    return "vllm" if value == "vllm" else "openai"


def pick_dialect(first_text: str, *, max_bytes: int) -> Dialect:
    """The dialect of a socket whose client sent ``first_text`` first (no protocol parameter)."""
    if len(first_text) > max_bytes:
        return "openai"  # refused by the session as too large either way
    try:
        event = json.loads(first_text)
    except (ValueError, RecursionError):  # the session's own parse refuses it with an error event
        return "openai"
    if not isinstance(event, dict):
        return "openai"
    kind = event.get("type")
    if kind == "session.update" and "session" not in event:
        return "vllm"
    if kind == "input_audio_buffer.commit":
        return "vllm"
    return "openai"
