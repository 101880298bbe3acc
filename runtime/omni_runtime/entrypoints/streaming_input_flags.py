"""`omni serve` flags of streaming-input sessions: the RFC's ``streaming_input.*`` settings.

The OmniDeployment's spec.streamingInput renders to these flags (operator plan/adapters.py), so a
deployment and a hand-run worker configure sessions alike. Kept apart from serve.py, which parses
the rest of the flags and calls `add_streaming_input_flags` and `realtime_settings`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from omni_runtime.contract import switches
from omni_runtime.media.limits import MediaLimits
from omni_runtime.realtime.settings import START_POLICIES, RealtimeSettings
from omni_runtime.support.cli_types import positive_int

_DEFAULTS = RealtimeSettings()


def _policy(text: str) -> str:
    if text not in START_POLICIES:
        raise argparse.ArgumentTypeError(
            f"invalid choice: {text!r} (choose from {', '.join(START_POLICIES)})"
        )
    return text


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number above 0")
    return value


# (flag, the RealtimeSettings field it sets, how its text parses, help); defaults are the settings'.
_VALUED: tuple[tuple[str, str, Callable[[str], object], str], ...] = (
    (
        "--streaming-input-session-timeout-sec",
        "session_timeout_s",
        _seconds,
        "an idle session is released after this many seconds",
    ),
    (
        "--streaming-input-max-payload-per-session",
        "max_payload_per_session",
        positive_int,
        "decoded bytes one session may carry; past it: 413, and the session closes",
    ),
    (
        "--streaming-input-start-policy",
        "start_policy",
        _policy,
        f"when work starts for sessions that do not choose: {', '.join(START_POLICIES)} (the last two send "
        "images and video frame pairs to the encoders as they arrive)",
    ),
    (
        "--streaming-input-min-length",
        "min_length_bytes",
        positive_int,
        "in-order payload bytes after which on_min_length starts",
    ),
    (
        "--streaming-input-max-sessions",
        "max_streaming_input_sessions",
        positive_int,
        "streaming-input sessions this worker holds at once",
    ),
)


def add_streaming_input_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("streaming input (streaming_input.*)")
    group.add_argument(
        "--no-streaming-input",
        action="store_true",
        help="refuse streaming-input sessions (streaming_input.enabled)",
    )
    for flag, name, parse, help_text in _VALUED:
        group.add_argument(flag, type=parse, default=getattr(_DEFAULTS, name), help=help_text)


def realtime_settings(args: argparse.Namespace, *, limits: MediaLimits) -> RealtimeSettings:
    """The session settings of parsed `omni serve` flags."""
    valued = {name: getattr(args, flag[2:].replace("-", "_")) for flag, name, _, _ in _VALUED}
    return RealtimeSettings(
        worker_id=args.worker_id,
        max_speech_streams=args.max_speech_streams,
        streaming_input_enabled=not args.no_streaming_input,
        duplex_by_default=args.pipeline == "duplex",
        media_limits=limits,
        warm_spoken_audio=switches.flag("OMNI_WARM_SPOKEN_AUDIO"),
        **valued,  # type: ignore[arg-type]
    )
