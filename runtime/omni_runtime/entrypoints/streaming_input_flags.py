"""`omni serve` flags of streaming-input sessions: the RFC's ``streaming_input.*`` settings.

The OmniDeployment's spec.streamingInput renders to these flags (operator plan/adapters.py), so a
deployment and a hand-run worker configure sessions alike. Kept apart from serve.py, which parses
the rest of the flags and calls `add_streaming_input_flags` and `realtime_settings`.
"""

from __future__ import annotations

import argparse

from omni_runtime.media.limits import MediaLimits
from omni_runtime.realtime.settings import START_POLICIES, RealtimeSettings
from omni_runtime.support.cli_types import positive_int

_DEFAULTS = RealtimeSettings()


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number above 0")
    return value


def add_streaming_input_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("streaming input (streaming_input.*)")
    group.add_argument(
        "--no-streaming-input",
        action="store_true",
        help="refuse streaming-input sessions (streaming_input.enabled)",
    )
    group.add_argument(
        "--streaming-input-session-timeout-sec",
        type=_seconds,
        default=_DEFAULTS.session_timeout_s,
        help="an idle session is released after this many seconds",
    )
    group.add_argument(
        "--streaming-input-max-payload-per-session",
        type=positive_int,
        default=_DEFAULTS.max_payload_per_session,
        help="decoded bytes one session may carry; past it: 413, and the session closes",
    )
    group.add_argument(
        "--streaming-input-start-policy",
        choices=START_POLICIES,
        default=_DEFAULTS.start_policy,
        help="when work starts for sessions that do not choose (on_first_chunk, on_min_length: images "
        "and video frame pairs are encoded as they arrive)",
    )
    group.add_argument(
        "--streaming-input-min-length",
        type=positive_int,
        default=_DEFAULTS.min_length_bytes,
        help="in-order payload bytes after which on_min_length starts",
    )
    group.add_argument(
        "--streaming-input-max-sessions",
        type=positive_int,
        default=_DEFAULTS.max_streaming_input_sessions,
        help="streaming-input sessions this worker holds at once",
    )


def realtime_settings(args: argparse.Namespace, *, limits: MediaLimits) -> RealtimeSettings:
    """The session settings of parsed `omni serve` flags."""
    return RealtimeSettings(
        worker_id=args.worker_id,
        streaming_input_enabled=not args.no_streaming_input,
        session_timeout_s=args.streaming_input_session_timeout_sec,
        max_payload_per_session=args.streaming_input_max_payload_per_session,
        start_policy=args.streaming_input_start_policy,
        min_length_bytes=args.streaming_input_min_length,
        max_streaming_input_sessions=args.streaming_input_max_sessions,
        media_limits=limits,
    )
