"""What every session protocol shares: ids of protocol objects, engine voices, closing engine streams.

Realtime sockets, video sockets and streaming-input sessions all name items and responses with
`new_id`, ask the engine for a speaker with `engine_voice` (stock OpenAI voice names mean the
model's default) and close an engine stream with `close_quietly` when a reply ends or is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
from typing import Any

# Stock OpenAI voice names mean "the model's default speaker" here.
OPENAI_VOICES = frozenset(
    {"alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar"}
)

_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    return f"{prefix}_{next(_ids):06d}{secrets.token_hex(4)}"


def engine_voice(voice: str | None) -> str | None:
    """The speaker to ask the engine for: stock OpenAI names mean the model's default."""
    return None if voice is None or voice in OPENAI_VOICES else voice


async def close_quietly(stream: Any) -> None:
    """Close the engine's stream (that cancels the request there) even when we were cancelled."""
    aclose = getattr(stream, "aclose", None)
    if aclose is None:
        return
    # RuntimeError: the generator is already closing on another path; nothing is left to free.
    with contextlib.suppress(RuntimeError, asyncio.CancelledError, StopAsyncIteration):
        await asyncio.shield(aclose())
