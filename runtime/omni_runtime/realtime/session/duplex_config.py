"""Duplex session settings: who decides turns, how the first units behave, how events are named.

A duplex session runs in one of two turn modes. With ``server_vad`` (the default) the voice
activity detector ends the user's turn and a response starts, as in any realtime session. In
model-driven mode (``auto_response: true`` or ``full_duplex: true``, as vLLM-Omni's duplex lane
spells them) the session decides listen or speak once per unit of appended audio (about 1 s), the
first ``force_listen_count`` units are forced to listen, and ``turn_detection`` may be null (then
the model alone decides; see `duplex_policy`); ``turn_detection.type: semantic_vad`` switches the
same decision on without ``auto_response``, its ``eagerness`` setting the unit. The fields are read from ``session.duplex``,
``session.extra_body`` (the released spelling) or the session object itself, in that order of
precedence; a bad value is one ``error`` event naming the field.

Event naming differs per endpoint (`event_dialect`): duplex bridges clock their playback on the
``response.audio.delta`` + ``response.audio_transcript.delta`` pair, which the native
``/v1/duplex`` socket sends; ``/v1/realtime?duplex=1`` keeps the GA names (as vLLM-Omni 0.30.0's
duplex client reads them); ``?event_names=`` chooses explicitly on either.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from omni_runtime.realtime.errors import invalid

Dialect = Literal["ga", "beta", "duplex"]
DIALECTS: tuple[Dialect, ...] = ("ga", "beta", "duplex")
MAX_FORCE_LISTEN = 600  # ten minutes of 1 s units


@dataclass(frozen=True)
class DuplexConfig:
    auto_response: bool = (
        False  # the model decides listen/speak per unit (released: extra_body.auto_response)
    )
    full_duplex: bool = False  # same switch, the other released spelling
    force_listen_count: int = 0  # the first N units of the session always listen
    unit_ms: int = 1000  # the decision clock
    backchannel_max_ms: int = 600  # overlap policy: shorter speech over the assistant is no barge-in

    @property
    def model_driven(self) -> bool:
        return self.auto_response or self.full_duplex

    def to_json(self) -> dict[str, Any]:
        return {
            "backchannel_max_ms": self.backchannel_max_ms,
            "auto_response": self.auto_response,
            "full_duplex": self.full_duplex,
            "force_listen_count": self.force_listen_count,
            "unit_ms": self.unit_ms,
        }


def _bool(value: Any, param: str) -> bool:
    if not isinstance(value, bool):
        raise invalid(param, f"expected true or false, got {value!r}")
    return value


def _int(value: Any, param: str, *, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise invalid(param, f"expected an integer from {lo} to {hi}, got {value!r}")
    return value


_FIELDS: dict[str, tuple[str, tuple[int, int] | None]] = {
    "auto_response": ("bool", None),
    "full_duplex": ("bool", None),
    "force_listen_count": ("int", (0, MAX_FORCE_LISTEN)),
    "unit_ms": ("int", (200, 5000)),
    "backchannel_max_ms": ("int", (0, 10_000)),
}


def parse_duplex(session: dict[str, Any], current: DuplexConfig) -> DuplexConfig:
    """``current`` with the duplex fields of a session.update body applied (raises ProtocolError)."""
    sources: list[tuple[str, dict[str, Any]]] = [("session", session)]
    for name in ("extra_body", "duplex"):
        value = session.get(name)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise invalid(f"session.{name}", "expected an object")
        sources.append((f"session.{name}", value))
    changes: dict[str, Any] = {}
    for prefix, source in sources:  # later sources win: duplex > extra_body > top level
        for name, (kind, bounds) in _FIELDS.items():
            if name not in source:
                continue
            if name == "backchannel_max_ms" and prefix == "session":
                continue  # only meaningful inside the duplex object (as before)
            param = f"{prefix}.{name}"
            if kind == "bool":
                changes[name] = _bool(source[name], param)
            else:
                assert bounds is not None
                changes[name] = _int(source[name], param, lo=bounds[0], hi=bounds[1])
    return replace(current, **changes)


def event_dialect(*, native: bool, beta_header: bool, query: str | None) -> Dialect:
    """The event names a socket gets: ?event_names= wins, then the endpoint, then the beta header."""
    if query:
        if query not in DIALECTS:
            raise invalid("event_names", f"{query!r} is not a dialect; use one of {', '.join(DIALECTS)}")
        return query  # type: ignore[return-value]
    if native:
        return "duplex"
    return "beta" if beta_header else "ga"
