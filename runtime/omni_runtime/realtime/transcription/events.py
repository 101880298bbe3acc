"""Client events of the vLLM transcription dialect, parsed and checked (pure: no engine calls, no I/O).

vLLM's realtime connection accepts three events: ``session.update`` with a required ``model``,
``input_audio_buffer.append`` with ``audio`` (base64 PCM16, mono, 16 kHz) and
``input_audio_buffer.commit`` with an optional boolean ``final``. Its ``session.update`` takes no
other field; this worker also reads a few optional ones (``modalities``, ``instructions``,
``max_tokens``, ``temperature``, ``voice``) so a client can ask for spoken output or a shorter answer,
and ignores the rest as vLLM does. Every malformed field is a `ProtocolError` naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from omni_runtime.realtime.audio import decode_b64, pcm16_to_float
from omni_runtime.realtime.errors import (
    INVALID_AUDIO,
    UNKNOWN_EVENT,
    ProtocolError,
    invalid,
    missing,
)
from omni_runtime.realtime.protocol import read_event
from omni_runtime.realtime.request_types import check_text

INPUT_RATE = 16_000  # vLLM's realtime audio: PCM16 mono at 16 kHz, no other rate
MODEL_NOT_FOUND = "model_not_found"  # vLLM's code for a session.update naming another model
EVENT_TYPES = ("session.update", "input_audio_buffer.append", "input_audio_buffer.commit")


@dataclass(frozen=True)
class TranscriptionConfig:
    """What a session asked for; the defaults hold until its first ``session.update``."""

    model: str
    max_tokens: int
    want_audio: bool = False
    instructions: str = ""
    voice: str | None = None
    temperature: float = 0.0  # vLLM transcribes greedily


def parse_event(text: str, *, max_bytes: int) -> dict[str, Any]:
    """One client message to an event object with a known ``type``."""
    event = read_event(text, max_bytes=max_bytes)
    if event["type"] not in EVENT_TYPES:
        raise ProtocolError(
            f"unknown event type {event['type']!r}; this protocol (vLLM realtime) has: {', '.join(EVENT_TYPES)}",
            code=UNKNOWN_EVENT,
            param="type",
        )
    return event


def apply_session_update(
    config: TranscriptionConfig,
    event: dict[str, Any],
    *,
    served_model: str,
    audio_out: bool,
    max_prompt_chars: int,
    max_model_len: int,
) -> TranscriptionConfig:
    """The config after a ``session.update``; the voice name is checked by the caller (engine voices)."""
    if "model" not in event:
        raise missing("model", where="session.update")
    model = event["model"]
    if not isinstance(model, str):
        raise invalid("model", "expected the model name as a string")
    if model != served_model:
        raise ProtocolError(
            f"The model `{model}` does not exist on this worker; it serves `{served_model}`.",
            code=MODEL_NOT_FOUND,
            param="model",
            status=404,
        )
    changes: dict[str, Any] = {"model": model}
    if "modalities" in event:
        changes["want_audio"] = _modalities(event["modalities"], audio_out=audio_out)
    if "instructions" in event:
        if not isinstance(event["instructions"], str):
            raise invalid("instructions", "expected a string")
        changes["instructions"] = check_text(
            event["instructions"], param="instructions", max_chars=max_prompt_chars
        )
    if "max_tokens" in event:
        value = event["max_tokens"]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= max_model_len:
            raise invalid(
                "max_tokens", f"expected an integer from 1 to {max_model_len} (the model's context)"
            )
        changes["max_tokens"] = value
    if "temperature" in event:
        value = event["temperature"]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 2:
            raise invalid("temperature", "expected a number from 0 to 2")
        changes["temperature"] = float(value)
    if "voice" in event:
        if event["voice"] is not None and not isinstance(event["voice"], str):
            raise invalid("voice", "expected a voice name")
        changes["voice"] = event["voice"]
    return replace(config, **changes)


def _modalities(value: Any, *, audio_out: bool) -> bool:
    """Whether ``modalities`` asks for audio; text is always produced (it is the transcription)."""
    if not isinstance(value, list) or not value or any(item not in ("text", "audio") for item in value):
        raise invalid("modalities", 'expected ["text"] or ["text", "audio"]')
    if "text" not in value:
        raise invalid("modalities", 'the text output is the transcription; use ["text"] or ["text", "audio"]')
    if "audio" in value and not audio_out:
        raise invalid("modalities", 'this worker\'s model has no speech output; use ["text"]')
    return "audio" in value


def parse_append(event: dict[str, Any], *, max_bytes: int) -> np.ndarray:
    """The samples of an ``input_audio_buffer.append`` (float32 at 16 kHz, at least one)."""
    if "audio" not in event:
        raise missing("audio", where="input_audio_buffer.append")
    pcm = pcm16_to_float(decode_b64(event["audio"], param="audio", max_bytes=max_bytes), param="audio")
    if pcm.size == 0:
        raise ProtocolError(
            "audio is empty; send base64 PCM16 (mono, 16 kHz) with at least one sample",
            code=INVALID_AUDIO,
            param="audio",
        )
    return pcm


def parse_commit(event: dict[str, Any]) -> bool:
    """Whether an ``input_audio_buffer.commit`` ends the input (``final``)."""
    final = event.get("final", False)
    if not isinstance(final, bool):
        raise invalid("final", "expected true (the input ends here) or false")
    return final
