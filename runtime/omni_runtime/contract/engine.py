"""The engine contract between the API layer and the stage pipeline (no torch here).

The API turns an OpenAI request into a `GenerationRequest`; the engine answers with an async
stream of events. Closing the stream (``aclose()``) cancels the request and frees its slot.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

MediaKind = Literal["audio", "image", "video"]


@dataclass(frozen=True)
class MediaInput:
    """Decoded media, ready for the processor.

    audio: float32 mono waveform at ``sample_rate`` (16 kHz for the audio encoder);
    image: uint8 array H x W x 3 (RGB); video: uint8 array T x H x W x 3 with ``fps``, and
    ``soundtrack``: its audio track (float32 mono, 16 kHz) when the request puts the audio in the
    video (``mm_processor_kwargs.use_audio_in_video``): its tokens are then interleaved with the
    video's by time, as Qwen-Omni's processor does.
    """

    kind: MediaKind
    data: np.ndarray
    sample_rate: int | None = None
    fps: float | None = None
    soundtrack: np.ndarray | None = None


@dataclass(frozen=True)
class ChatTurn:
    role: Literal["system", "user", "assistant"]
    text: str = ""
    media: tuple[MediaInput, ...] = ()


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 2048
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False  # benchmarks: generate exactly max_tokens


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    turns: tuple[ChatTurn, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    want_audio: bool = False
    voice: str | None = None
    stream_audio: bool = True  # emit audio chunks while the thinker still generates (streaming-speech)
    stage_params: dict[str, dict[str, object]] = field(default_factory=dict)
    # Conversation KV: requests of one session (a realtime socket, a chat X-Session-Id) reuse the
    # thinker KV of the session's previous turn for the prompt prefix that is exactly the same.
    session_key: str | None = None


@dataclass(frozen=True)
class TextDelta:
    text: str
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class AudioChunk:
    pcm: np.ndarray  # float32 mono in [-1, 1]
    sample_rate: int


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    audio_seconds: float = 0.0
    cached_tokens: int = 0  # prompt tokens served from the session's kept KV (conversation KV)


@dataclass(frozen=True)
class Finished:
    reason: Literal["stop", "length", "cancelled", "error"]
    usage: Usage = field(default_factory=Usage)
    error: str | None = None


EngineEvent = TextDelta | AudioChunk | Finished


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory as this process's caching allocator sees it (counters since start).

    ``alloc_retries`` counts allocations that failed at first and succeeded only after every cached
    block was handed back to the driver: each one waits for the whole GPU and makes the next
    allocations pay the driver again, a stall every stream on the GPU feels.
    """

    gpu: int
    allocated_bytes: int = 0
    reserved_bytes: int = 0
    alloc_retries: int = 0
    ooms: int = 0
    process: str = ""  # "" this process; a stage process behind a stage link: the stages it hosts


# Upper bounds (seconds) of a ``TimeHistogram``'s buckets, +Inf after the last.
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(frozen=True)
class TimeHistogram:
    """Durations of one kind, as a histogram (counters): what waited at a stage, or one phase of
    the way to a reply's first audio.

    A stage's ``kind`` says what waited: ``admission`` (a scheduler's request, submitted until
    taken into a step), ``first`` and ``later`` (a vocoder's first windows of a stream and the
    rest), ``all`` (an encoder's requests). A phase's ``kind`` is its name (``FIRST_AUDIO_PHASES``).
    ``counts`` has one count per bucket of ``WAIT_BUCKETS`` plus one past the last (not cumulative).
    """

    kind: str
    counts: tuple[int, ...]
    sum_s: float

    @property
    def count(self) -> int:
        return sum(self.counts)


# The way of a streaming speech reply to its first audio, in order; their sum is the engine's time
# to first audio (omni_first_audio_phase_seconds{phase}).
FIRST_AUDIO_PHASES = (
    "prompt",  # accepted -> the thinker job submitted: preprocessing, media encoders, aggregation
    "first_token",  # -> the thinker's first token: its admission wait and prefill
    "talker_first_code",  # -> the talker's first code: the second token, the talker's admission
    "first_window_codes",  # -> the first window's codes all made, at the thinker's token pace
    "first_window",  # -> its audio back: a wait for other replies' first windows, the line, the synthesis
)


@dataclass(frozen=True)
class StageLoad:
    """How much one stage thread of this process has worked since start (counters).

    ``busy_s`` is wall time inside the stage's calls (GPU waits included): its rate over a load is
    the stage's utilisation. ``items`` counts what the calls carried (rows stepped by a scheduler,
    requests or windows in a batch), so ``items / calls`` is the mean batch.
    """

    stage: str
    busy_s: float = 0.0
    calls: int = 0
    items: int = 0
    # Cancellation: rows finished by a cancel (thinker, talker) or queued windows dropped unrun
    # (vocoder); and the part of ``busy_s`` spent after a request of the running call was
    # cancelled, i.e. the rest of the one call a cancel cannot interrupt.
    cancelled: int = 0
    after_cancel_s: float = 0.0
    working: bool = False  # a call running or waiting for the thread now
    waits: tuple[TimeHistogram, ...] = ()  # what waited for this stage's calls, by kind


@dataclass(frozen=True)
class ProcessStats:
    """What one process's stages report (counters since its start): the worker's own, and each
    stage process behind a stage link over it (``stats.get``), merged into the worker's
    EngineStats so that its /metrics covers every stage of the worker."""

    process: str  # the stages it hosts, comma-joined in stage order
    queue_depth: int = 0  # requests waiting for its encoders or a thinker slot
    running_batch: int = 0  # the thinker's running rows, where the thinker runs in it
    max_running_batch: int = 0  # ... and the largest batch it ran since its start
    thinker_steps: int = 0  # ... its decode steps since its start
    thinker_steps_ahead: int = 0  # ... of them queued before the previous one's tokens were read
    stages: tuple[StageLoad, ...] = ()
    gpus: tuple[GpuMemory, ...] = ()
    session_kv: dict[str, int] = field(default_factory=dict)  # EngineStats' session_kv_* by suffix
    talker_kv: dict[str, int] = field(default_factory=dict)  # EngineStats' talker_kv_* by suffix


@dataclass(frozen=True)
class EngineStats:
    queue_depth: int = 0
    running_batch: int = 0
    max_running_batch: int = 0  # largest batch seen since start (observability and tests)
    # The thinker's decode steps since start, and those queued before the previous step's tokens
    # were read (OMNI_THINKER_AHEAD).
    thinker_steps: int = 0
    thinker_steps_ahead: int = 0
    active_requests: int = 0
    stages: tuple[StageLoad, ...] = ()  # the stage threads of this process
    # Encoder outputs kept by content (pipeline/encoder_cache.py): units served without encoding,
    # units encoded, entries dropped for room; and media submitted for encoding ahead of a request.
    encoder_cache_hits: int = 0
    encoder_cache_misses: int = 0
    encoder_cache_evictions: int = 0
    encoder_cache_bytes: int = 0
    prefetch_submitted: int = 0
    prefetch_done: int = 0
    prefetch_failed: int = 0
    first_audio_phases: tuple[TimeHistogram, ...] = ()  # streaming speech replies, by phase
    # Streaming speech replies in flight now (accepted, not ended: the load a first window is cut
    # under), and how many replies' first window was the longer one cut under load
    # (``SegmenterConfig.first_chunk_busy``).
    speech_replies: int = 0
    busy_first_windows: int = 0
    # First windows that waited for other replies' to share a vocoder call, and the seconds they
    # waited in all (``deadlines.lingers``).
    lingered_first_windows: int = 0
    first_window_linger_seconds: float = 0.0
    # Conversation KV (pipeline/conversation_kv.py): sessions with kept thinker KV, its bytes and
    # budget; session turns admitted after a kept prefix (hits) or prefilled in full (misses),
    # prompt tokens served from kept KV, and entries dropped for room; shared prompt prefixes
    # (OMNI_SHARED_PREFIX) kept, the admissions that reused one and the tokens they took from them.
    session_kv_entries: int = 0
    session_kv_bytes: int = 0
    session_kv_capacity_bytes: int = 0
    session_kv_hits: int = 0
    session_kv_misses: int = 0
    session_kv_reused_tokens: int = 0
    session_kv_prefilled_tokens: int = 0
    session_kv_evictions: int = 0
    session_kv_shared_entries: int = 0
    session_kv_shared_hits: int = 0
    session_kv_shared_tokens: int = 0
    # The talker's own kept KV of a session's prompt (pipeline/talker.py), by the same counts.
    talker_kv_entries: int = 0
    talker_kv_bytes: int = 0
    talker_kv_hits: int = 0
    talker_kv_misses: int = 0
    talker_kv_reused_tokens: int = 0
    talker_kv_prefilled_tokens: int = 0
    talker_kv_evictions: int = 0
    gpus: tuple[GpuMemory, ...] = ()  # the GPUs this process and its stage processes allocated on
    # Scrapes where a stage process behind a stage link did not report its stats in time.
    remote_stats_failures: int = 0


class EngineError(Exception):
    """A request the engine cannot serve; ``param`` names the offending field for the API error."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


class Engine(Protocol):
    model_name: str
    output_sample_rate: int  # the talker's true rate (24000 for Qwen2.5-Omni)
    supports_audio_output: bool
    max_model_len: int

    @property
    def ready(self) -> bool: ...

    @property
    def voices(self) -> tuple[str, ...]:
        """The model's speakers (empty while not known: not loaded, text only, or the talker elsewhere)."""
        ...

    @property
    def default_voice(self) -> str | None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]: ...

    def prefetch_media(self, media: Sequence[MediaInput], *, audio_prefix: bool = False) -> bool:
        """Start preprocessing and encoding ``media`` that a request will soon carry, so that
        request's encoder stages find the work done (exactly the same outputs). Returns whether work
        was submitted (False: nothing to do, or this engine keeps no encoder outputs).
        ``audio_prefix``: the audio is the start of speech still arriving; only its whole chunks
        (``audio_chunk_samples``) are encoded."""
        ...

    @property
    def audio_chunk_samples(self) -> int | None:
        """16 kHz samples per chunk the audio encoder encodes on its own (speech can be encoded
        while it is spoken, chunk by chunk); None when this engine cannot."""
        ...

    def stats(self) -> EngineStats: ...

    async def refresh_stats(self) -> None:
        """Fetch what ``stats`` cannot read in this process (stage processes' counters)."""
        ...

    async def warm_session(self, request: GenerationRequest) -> int:
        """Prefill ``request``'s prompt (a session's history) into the session's kept KV, with no
        output, so its next turn prefills only what is new; returns the prompt tokens reused."""
        ...

    def end_session(self, session_key: str) -> None:
        """The session is over: free what the engine keeps for it (its conversation KV)."""
        ...
