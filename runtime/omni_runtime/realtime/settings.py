"""Limits and defaults of the realtime endpoints, in one typed place (no torch here).

Every session kind (realtime sockets, streaming video sockets, streaming-input sessions) is bounded
so one client cannot exhaust a worker: how many at once, how long, how much buffered input, how long
idle. The values are exported as Prometheus gauges (`omni_realtime_limit`) so an operator can see
the limits a worker actually runs with next to the live counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from omni_runtime.contract.workers import DEFAULT_MAX_SPEECH_STREAMS
from omni_runtime.media.limits import MediaLimits

START_POLICIES = ("on_end_only", "on_first_chunk", "on_min_length")

# Prompt text is bounded before it is tokenized. A token is rarely longer than a few characters and
# every chat message costs at least four template tokens, so past these derived caps a prompt
# cannot fit the model's context anyway; refusing early saves seconds of tokenizer time.
CHARS_PER_CONTEXT_TOKEN = 32
TOKENS_PER_MESSAGE = 4


def prompt_limits(
    max_model_len: int, *, max_chars: int | None = None, max_messages: int | None = None
) -> tuple[int, int]:
    """(most characters of prompt text, most messages) for a model context; None: derived from it."""
    return (
        max_chars if max_chars is not None else CHARS_PER_CONTEXT_TOKEN * max_model_len,
        max_messages if max_messages is not None else max(1, max_model_len // TOKENS_PER_MESSAGE),
    )


@dataclass(frozen=True)
class RealtimeSettings:
    worker_id: str = "worker-0"  # embedded in session ids / resume tokens so the router pins follow-ups
    # Concurrent speech streams (chat with audio out, speaking realtime and video sessions); past it
    # new ones are refused (realtime.capacity). 0: no limit. `omni serve --max-speech-streams`.
    max_speech_streams: int = DEFAULT_MAX_SPEECH_STREAMS

    # --- /v1/realtime ------------------------------------------------------------------------
    # A duplex worker (`omni serve --pipeline duplex`): /v1/realtime sessions are full duplex unless
    # the client asks ?duplex=0 (otherwise only with ?duplex=1, and /v1/duplex always).
    duplex_by_default: bool = False
    max_realtime_sessions: int = 64
    # Prefill the turn being spoken, chunk by chunk, into the session's kept KV while the user
    # speaks (session/warmup.py); on by default since it was measured on an H100 (docs/benchmarks.md);
    # `OMNI_WARM_SPOKEN_AUDIO=0` turns it off (`omni serve` reads it, in
    # entrypoints.streaming_input_flags.realtime_settings, after checking every switch).
    warm_spoken_audio: bool = True
    max_session_seconds: float = 3600.0  # a socket open longer is closed with an error event
    session_idle_timeout_s: float = 600.0  # no client event for this long closes the session
    max_event_bytes: int = 8 * 1024 * 1024  # one client message (JSON text), checked before parsing
    max_input_buffer_seconds: float = 300.0  # uncommitted input audio (turn_detection none)
    max_conversation_items: int = 512
    audio_delta_ms: int = 100  # output audio is split into deltas of at most this length
    default_voice: str | None = None
    default_instructions: str = ""
    default_max_output_tokens: int = 1024  # capped by the model's context (default_max_tokens)
    # Prompt text of one request (instructions, messages, text items and chunks); None: derived
    # from the model's context (`prompt_limits`).
    max_prompt_chars: int | None = None
    max_prompt_messages: int | None = None

    # Server VAD defaults (the OpenAI defaults).
    vad_threshold: float = 0.5
    vad_prefix_padding_ms: int = 300
    vad_silence_duration_ms: int = 500

    # Full duplex (?duplex=1).
    backchannel_max_ms: int = 600  # speech shorter than this while the assistant talks does not cancel
    resume_grace_s: float = 30.0  # a dropped duplex session waits this long for its client
    max_replay_events: int = 2048  # events kept for replay after a reconnect
    max_replay_bytes: int = 4 * 1024 * 1024  # about 40 s of 24 kHz audio deltas

    # --- /v1/video/chat/stream ---------------------------------------------------------------
    max_video_sessions: int = 16
    max_video_frame_bytes: int = 8 * 1024 * 1024  # one encoded frame
    max_video_buffer_bytes: int = 256 * 1024 * 1024  # decoded frames held by one session
    max_video_frames: int = 256  # upper bound of a session's max_frames
    max_video_audio_seconds: float = 600.0

    # --- streaming-input sessions (Mode B) and NDJSON chat (Mode A) -----------------------
    streaming_input_enabled: bool = True
    max_streaming_input_sessions: int = 256
    session_timeout_s: float = 300.0  # idle streaming-input sessions are released after this
    max_payload_per_session: int = 64 * 1024 * 1024  # decoded bytes of all chunks of one session
    max_chunks_per_session: int = 4096
    # A chunk may run at most this many ids ahead of the next one expected: gaps are counted, never
    # listed, and a far-off id is refused at once instead of promising millions of missing chunks.
    sequence_window: int = 4096
    start_policy: str = "on_end_only"  # default when a session does not choose
    min_length_bytes: int = 32 * 1024  # on_min_length starts once this many payload bytes are in order
    result_wait_s: float = 60.0  # GET .../result waits this long for a running generation
    max_result_wait_s: float = 300.0  # the most a client may ask for with ?wait=

    media_limits: MediaLimits = field(default_factory=MediaLimits)

    def __post_init__(self) -> None:
        if self.start_policy not in START_POLICIES:
            raise ValueError(
                f"start_policy must be one of {', '.join(START_POLICIES)}, got {self.start_policy!r}"
            )
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
                raise ValueError(f"{item.name} must not be negative, got {value}")

    def limits(self) -> dict[str, float]:
        """The numeric limits, by name, for the metrics gauge."""
        return {
            item.name: float(getattr(self, item.name))
            for item in fields(self)
            if item.name.startswith(("max_", "session_", "resume_", "backchannel_"))
            and isinstance(getattr(self, item.name), int | float)
        }


def default_max_tokens(settings: RealtimeSettings, *, max_model_len: int) -> int:
    """The output budget of a response that names none: the setting, within the model's context."""
    return max(1, min(settings.default_max_output_tokens, max_model_len))
