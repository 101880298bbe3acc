"""spec.streamingInput: the RFC's ``streaming_input.*`` settings of the builtin runtime's workers.

Kept apart from spec.py, which holds the rest of the OmniDeployment spec, and imported there.
Every field left unset means the runtime's own default, and then no flag is rendered, so a
deployment that does not use the field keeps its pod templates (and its revision).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class StartPolicy(StrEnum):
    on_end_only = "on_end_only"
    on_first_chunk = "on_first_chunk"
    on_min_length = "on_min_length"


MAX_SESSION_BYTES = 1 << 34
"""16 GiB: the most maxPayloadPerSession may allow, and so the most minLengthBytes can mean (a session
never holds more; the runtime's flags take any integer >= 1, so this bound is the operator's)."""


class StreamingInputSpec(BaseModel):
    """Streaming-input sessions (Mode B) and chunked chat uploads (Mode A) on each worker."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    enabled: bool = Field(
        default=True, description="Serve streaming-input sessions (--no-streaming-input when off)."
    )
    session_timeout_sec: float | None = Field(
        default=None,
        gt=0,
        le=86400,
        description="Seconds an idle session is kept before it is released; unset: the runtime's 300 "
        "(--streaming-input-session-timeout-sec).",
    )
    max_payload_per_session: int | None = Field(
        default=None,
        ge=1,
        le=MAX_SESSION_BYTES,
        description="Decoded bytes one session may carry; past it the chunk gets 413 and the session "
        "closes; unset: 64 MiB (--streaming-input-max-payload-per-session).",
    )
    start_policy: StartPolicy | None = Field(
        default=None,
        description="When work starts for sessions that do not choose: on_end_only, on_first_chunk "
        "(each image and video frame pair is encoded as it arrives) or on_min_length; unset: "
        "on_end_only (--streaming-input-start-policy).",
    )
    min_length_bytes: int | None = Field(
        default=None,
        ge=1,
        le=MAX_SESSION_BYTES,
        description="In-order payload bytes after which on_min_length starts (at most 16 GiB, the "
        "largest payload a session may carry); unset: 32 KiB (--streaming-input-min-length).",
    )
    max_sessions: int | None = Field(
        default=None,
        ge=1,
        le=100000,
        description="Streaming-input sessions one worker holds at once; unset: 256 "
        "(--streaming-input-max-sessions).",
    )


def streaming_input_flags(spec: StreamingInputSpec) -> list[str]:
    """The `omni serve` flags of a StreamingInputSpec (none for fields left unset)."""
    flags = [] if spec.enabled else ["--no-streaming-input"]
    for flag, value in (
        ("--streaming-input-session-timeout-sec", spec.session_timeout_sec),
        ("--streaming-input-max-payload-per-session", spec.max_payload_per_session),
        ("--streaming-input-start-policy", spec.start_policy.value if spec.start_policy else None),
        ("--streaming-input-min-length", spec.min_length_bytes),
        ("--streaming-input-max-sessions", spec.max_sessions),
    ):
        if value is not None:
            flags += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return flags
