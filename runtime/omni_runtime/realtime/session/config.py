"""Session configuration of /v1/realtime and its `session.update`, in GA and beta shapes.

The GA protocol nests audio settings (``session.audio.input.format``, ``.turn_detection``,
``session.audio.output.voice``) and names the output ``output_modalities``; the beta protocol had
them flat (``modalities``, ``input_audio_format``, ``turn_detection``, ``voice``). Both are
accepted (``semantic_vad`` only on duplex sessions, where the model ends turns: `duplex.py`); an update is validated completely before anything changes, so a bad field leaves the
session as it was and the client gets one ``error`` event naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from omni_runtime.realtime.audio import SUPPORTED_RATES
from omni_runtime.realtime.errors import invalid
from omni_runtime.realtime.session.duplex_config import DuplexConfig, parse_duplex
from omni_runtime.realtime.settings import RealtimeSettings

MAX_OUTPUT_TOKENS = 1_000_000  # session.update's and response.create's max_output_tokens at most

EAGERNESS_UNIT_MS = {"low": 2000, "medium": 1000, "auto": 1000, "high": 500}


@dataclass(frozen=True)
class TurnDetection:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None
    type: str = "server_vad"  # or semantic_vad: VAD hears speech, the model decides when the turn ends
    eagerness: str = (
        "auto"  # semantic_vad: how soon the model is asked (low 2 s, auto/medium 1 s, high 0.5 s)
    )

    @property
    def semantic(self) -> bool:
        return self.type == "semantic_vad"

    def to_json(self) -> dict[str, Any]:
        if self.semantic:
            return {
                "type": "semantic_vad",
                "eagerness": self.eagerness,
                "create_response": self.create_response,
                "interrupt_response": self.interrupt_response,
            }
        return {
            "type": "server_vad",
            "threshold": self.threshold,
            "prefix_padding_ms": self.prefix_padding_ms,
            "silence_duration_ms": self.silence_duration_ms,
            "create_response": self.create_response,
            "interrupt_response": self.interrupt_response,
            "idle_timeout_ms": self.idle_timeout_ms,
        }


@dataclass(frozen=True)
class SessionConfig:
    model: str
    want_audio: bool
    instructions: str = ""
    voice: str | None = None
    input_rate: int = 24_000
    output_rate: int = 24_000
    turn_detection: TurnDetection | None = None
    max_output_tokens: int | None = None  # None: "inf" (the server's default cap)
    temperature: float = 0.8
    duplex: DuplexConfig = field(default_factory=DuplexConfig)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def initial(
        cls, *, model: str, audio_out: bool, settings: RealtimeSettings, duplex: bool
    ) -> SessionConfig:
        vad = TurnDetection(
            threshold=settings.vad_threshold,
            prefix_padding_ms=settings.vad_prefix_padding_ms,
            silence_duration_ms=settings.vad_silence_duration_ms,
        )
        return cls(
            model=model,
            want_audio=audio_out,
            instructions=settings.default_instructions,
            voice=settings.default_voice,
            # Like the OpenAI API, a new session listens with server VAD; duplex sessions must.
            turn_detection=vad,
            duplex=DuplexConfig(backchannel_max_ms=settings.backchannel_max_ms),
        )

    @property
    def backchannel_max_ms(self) -> int:
        return self.duplex.backchannel_max_ms

    def modalities(self) -> list[str]:
        return ["audio"] if self.want_audio else ["text"]

    def to_json(self, *, session_id: str, beta: bool, duplex: bool) -> dict[str, Any]:
        vad = self.turn_detection.to_json() if self.turn_detection else None
        max_tokens: int | str = self.max_output_tokens if self.max_output_tokens is not None else "inf"
        if beta:
            return {
                "id": session_id,
                "object": "realtime.session",
                "model": self.model,
                "modalities": ["text", "audio"] if self.want_audio else ["text"],
                "instructions": self.instructions,
                "voice": self.voice,
                "input_audio_format": "pcm16",
                "output_audio_format": "pcm16",
                "turn_detection": vad,
                "temperature": self.temperature,
                "max_response_output_tokens": max_tokens,
                "tools": [],
                "tool_choice": "auto",
            }
        body: dict[str, Any] = {
            "type": "realtime",
            "object": "realtime.session",
            "id": session_id,
            "model": self.model,
            "output_modalities": self.modalities(),
            "instructions": self.instructions,
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": self.input_rate},
                    "turn_detection": vad,
                    "transcription": None,
                    "noise_reduction": None,
                },
                "output": {
                    "format": {"type": "audio/pcm", "rate": self.output_rate},
                    "voice": self.voice,
                    "speed": 1.0,
                },
            },
            "max_output_tokens": max_tokens,
            "tools": [],
            "tool_choice": "auto",
        }
        if duplex:
            body["duplex"] = self.duplex.to_json()
        return body


def _rate_of(value: Any, param: str) -> int:
    if value == "pcm16":
        return 24_000
    if isinstance(value, dict):
        kind = value.get("type", "audio/pcm")
        if kind not in ("audio/pcm", "pcm16"):
            raise invalid(
                param, f"format {kind!r} is not supported; use {{'type': 'audio/pcm', 'rate': 24000}}"
            )
        rate = value.get("rate", 24_000)
        if rate not in SUPPORTED_RATES:
            raise invalid(f"{param}.rate", f"{rate!r} is not supported; use 16000 or 24000")
        return int(rate)
    raise invalid(param, "expected 'pcm16' or {'type': 'audio/pcm', 'rate': 16000|24000}")


def _number(value: Any, param: str, *, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise invalid(param, f"expected a number from {lo:g} to {hi:g}, got {value!r}")
    return float(value)


def integer_in(value: Any, param: str, *, lo: int, hi: int) -> int:
    """``value`` as an int in ``[lo, hi]``, else an ``invalid`` error naming ``param`` and the range."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise invalid(param, f"expected an integer from {lo} to {hi}, got {value!r}")
    return value


def _object_or_empty(value: Any, param: str) -> dict[str, Any]:
    """An optional nested object of a session update: absent or null is empty, anything else must be an object."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(param, "expected an object")
    return value


def _bool(value: Any, param: str) -> bool:
    if not isinstance(value, bool):
        raise invalid(param, f"expected true or false, got {value!r}")
    return value


def parse_turn_detection(value: Any, current: TurnDetection | None, param: str) -> TurnDetection | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid(param, "expected an object or null")
    kind = value.get("type", "server_vad")
    if kind not in ("server_vad", "semantic_vad"):
        raise invalid(f"{param}.type", f"{kind!r} is not supported; use 'server_vad', 'semantic_vad' or null")
    base = current or TurnDetection()
    changes: dict[str, Any] = {"type": kind}
    if "eagerness" in value:
        if not isinstance(value["eagerness"], str) or value["eagerness"] not in EAGERNESS_UNIT_MS:
            raise invalid(f"{param}.eagerness", f"expected one of {', '.join(EAGERNESS_UNIT_MS)}")
        changes["eagerness"] = value["eagerness"]
    if "threshold" in value:
        changes["threshold"] = _number(value["threshold"], f"{param}.threshold", lo=0.0, hi=1.0)
    for name in ("prefix_padding_ms", "silence_duration_ms"):
        if name in value:
            changes[name] = integer_in(value[name], f"{param}.{name}", lo=0, hi=10_000)
    for name in ("create_response", "interrupt_response"):
        if name in value:
            changes[name] = _bool(value[name], f"{param}.{name}")
    if "idle_timeout_ms" in value:
        idle = value["idle_timeout_ms"]
        changes["idle_timeout_ms"] = (
            None if idle is None else integer_in(idle, f"{param}.idle_timeout_ms", lo=5_000, hi=30_000)
        )
    return replace(base, **changes)


def parse_modalities(value: Any, param: str, *, audio_out: bool) -> bool:
    """True when the reply should be audio (with a transcript), False for text only."""
    if not isinstance(value, list) or not value or any(m not in ("text", "audio") for m in value):
        raise invalid(param, "expected ['text'] or ['audio'] (beta: ['text', 'audio'])")
    want_audio = "audio" in value
    if want_audio and not audio_out:
        raise invalid(param, "this worker serves text only (started with --pipeline text); use ['text']")
    return want_audio


def apply_update(config: SessionConfig, session: Any, *, audio_out: bool, duplex: bool) -> SessionConfig:
    """A new config with ``session`` (the body of session.update) applied; raises ProtocolError."""
    if not isinstance(session, dict):
        raise invalid("session", "expected an object")
    changes: dict[str, Any] = {}
    if "output_modalities" in session:
        changes["want_audio"] = parse_modalities(
            session["output_modalities"], "session.output_modalities", audio_out=audio_out
        )
    elif "modalities" in session:
        changes["want_audio"] = parse_modalities(
            session["modalities"], "session.modalities", audio_out=audio_out
        )
    if "instructions" in session:
        if not isinstance(session["instructions"], str):
            raise invalid("session.instructions", "expected a string")
        changes["instructions"] = session["instructions"]
    audio = session.get("audio")
    if audio is not None and not isinstance(audio, dict):
        raise invalid("session.audio", "expected an object")
    audio_in = _object_or_empty((audio or {}).get("input"), "session.audio.input")
    audio_out_cfg = _object_or_empty((audio or {}).get("output"), "session.audio.output")
    if "format" in audio_in:
        changes["input_rate"] = _rate_of(audio_in["format"], "session.audio.input.format")
    elif "input_audio_format" in session:
        changes["input_rate"] = _rate_of(session["input_audio_format"], "session.input_audio_format")
    if "format" in audio_out_cfg:
        changes["output_rate"] = _rate_of(audio_out_cfg["format"], "session.audio.output.format")
    elif "output_audio_format" in session:
        changes["output_rate"] = _rate_of(session["output_audio_format"], "session.output_audio_format")
    voice: Any = audio_out_cfg.get("voice", session.get("voice"))
    if voice is not None:
        if isinstance(voice, dict):
            voice = voice.get("id")
        if not isinstance(voice, str) or not voice:
            raise invalid("session.audio.output.voice", "expected a voice name")
        changes["voice"] = voice
    if "turn_detection" in audio_in:
        changes["turn_detection"] = parse_turn_detection(
            audio_in["turn_detection"], config.turn_detection, "session.audio.input.turn_detection"
        )
    elif "turn_detection" in session:
        changes["turn_detection"] = parse_turn_detection(
            session["turn_detection"], config.turn_detection, "session.turn_detection"
        )
    for name in ("max_output_tokens", "max_response_output_tokens"):
        if name in session:
            value = session[name]
            changes["max_output_tokens"] = (
                None if value == "inf" else integer_in(value, f"session.{name}", lo=1, hi=MAX_OUTPUT_TOKENS)
            )
    if "temperature" in session:
        changes["temperature"] = _number(session["temperature"], "session.temperature", lo=0.0, hi=2.0)
    if duplex:
        changes["duplex"] = parse_duplex(session, config.duplex)
    new = replace(config, **changes)
    if new.turn_detection is not None and new.turn_detection.semantic and not duplex:
        raise invalid(
            "session.audio.input.turn_detection.type",
            "semantic_vad is served on duplex sessions (/v1/duplex or /v1/realtime?duplex=1), where the "
            "model decides when the user's turn ends; use server_vad here",
        )
    if duplex and new.turn_detection is None and not new.duplex.model_driven:
        raise invalid(
            "session.audio.input.turn_detection",
            "a duplex session needs server_vad, or auto_response: true (the model decides listen or speak) "
            "for turn_detection null",
        )
    return new
