"""OpenAI chat-completion shapes for results of streaming-input sessions (JSON and SSE chunks).

Streaming-input sessions answer like ``/v1/chat/completions``: a ``chat.completion`` object, or
``chat.completion.chunk`` events over SSE ending in ``data: [DONE]``. Speech comes as base64 WAV
(whole reply, header at the talker's true rate) or, streamed, in ``delta.audio.data`` as the chat
route sends it: each piece a small WAV file (``audio.format`` "wav", the default) or raw PCM16.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from typing import Any

import numpy as np

from omni_runtime.contract.engine import Usage
from omni_runtime.media.audio import encode_wav, to_pcm16


def completion_id() -> str:
    return f"chatcmpl-{secrets.token_hex(12)}"


def finish_reason(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def usage_json(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def completion_json(
    *,
    completion: str,
    model: str,
    created: int,
    text: str,
    audio: np.ndarray | None,
    sample_rate: int,
    reason: str,
    usage: Usage,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if audio is not None:
        message["audio"] = {
            "id": f"audio_{completion}",
            "data": base64.b64encode(encode_wav(audio, sample_rate=sample_rate)).decode("ascii"),
            "expires_at": created + 3600,
            "transcript": text,
        }
    return {
        "id": completion,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(reason)}],
        "usage": usage_json(usage),
    }


def chunk_json(
    *,
    completion: str,
    model: str,
    created: int,
    delta: dict[str, Any],
    reason: str | None = None,
    usage: Usage | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": completion,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason(reason) if reason else None}],
    }
    if usage is not None:
        body["usage"] = usage_json(usage)
    return body


def audio_delta(pcm: np.ndarray, *, sample_rate: int, completion: str, fmt: str = "wav") -> dict[str, Any]:
    """A streamed audio piece as the chat route sends it: a small WAV file each, or raw PCM16."""
    payload = encode_wav(pcm, sample_rate=sample_rate) if fmt == "wav" else to_pcm16(pcm)
    return {
        "audio": {
            "id": f"audio_{completion}",
            "data": base64.b64encode(payload).decode("ascii"),
            "format": fmt,
            "sample_rate": sample_rate,
        }
    }


def sse(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n"


def now() -> int:
    return int(time.time())
