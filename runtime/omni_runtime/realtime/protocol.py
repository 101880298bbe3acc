"""What every session protocol shares: ids of protocol objects, engine voices, closing engine streams.

Realtime sockets, video sockets and streaming-input sessions all name items and responses with
`new_id`, ask the engine for a speaker with `engine_voice` (OpenAI voice names mapped onto the
model's speakers by `omni_runtime.contract.voices`) and close an engine stream with `close_quietly` when a reply ends or is cancelled.
`read_event` turns one socket message into an event object, or the `ProtocolError` that says why not.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import secrets
from typing import Any

from omni_runtime.contract.engine import Engine
from omni_runtime.contract.voices import UnknownVoice, resolve_voice
from omni_runtime.realtime.errors import EVENT_TOO_LARGE, INVALID_EVENT, INVALID_JSON, ProtocolError, invalid

_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    return f"{prefix}_{next(_ids):06d}{secrets.token_hex(4)}"


def engine_voice(voice: str | None, *, engine: Engine, param: str) -> str | None:
    """The model speaker for ``voice`` (OpenAI names mapped, `contract.voices`); ProtocolError naming
    ``param`` for a voice the model lacks."""
    try:
        return resolve_voice(voice, voices=engine.voices, default=engine.default_voice)
    except UnknownVoice as exc:
        raise invalid(param, str(exc)) from exc


async def close_quietly(stream: Any) -> None:
    """Close the engine's stream (that cancels the request there) even when we were cancelled."""
    aclose = getattr(stream, "aclose", None)
    if aclose is None:
        return
    # RuntimeError: the generator is already closing on another path; nothing is left to free.
    with contextlib.suppress(RuntimeError, asyncio.CancelledError, StopAsyncIteration):
        await asyncio.shield(aclose())


def read_event(text: str, *, max_bytes: int) -> dict[str, Any]:
    """One client message as a JSON object with a string ``type`` (the size is checked before parsing)."""
    if len(text) > max_bytes:
        raise ProtocolError(
            f"the event is {len(text)} bytes; at most {max_bytes} are accepted (send audio in smaller appends)",
            code=EVENT_TOO_LARGE,
        )
    try:
        event = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep to parse
        raise ProtocolError(f"the message is not valid JSON: {exc}", code=INVALID_JSON) from exc
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise ProtocolError(
            'an event is a JSON object with a string "type"', code=INVALID_EVENT, param="type"
        )
    return event
