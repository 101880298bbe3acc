"""The model-adapter contract: what the stage pipeline asks of an omni model family.

The pipeline (omni_runtime.pipeline) schedules and batches; an adapter knows one model family's
modules and how data flows between them. Each method below is one stage's compute, called from
that stage's worker thread with already-batched inputs, so adding Qwen3-Omni-MoE means writing
one more adapter (its thinker is MoE, its talker adds a code predictor, its vocoder is Code2Wav)
while the scheduler, cache, sampler and stage graph stay as they are.

This module imports no torch: the pipeline and the model families import these types, and tensors
travel through them as opaque values (``Any``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Protocol

from omni_runtime.contract.engine import GenerationRequest


@dataclass(frozen=True)
class RowSampling:
    """Sampling settings of one row (a request in a decode batch)."""

    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = -1  # <= 0: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None  # None: a fresh random seed per request
    suppress_tokens: tuple[int, ...] = ()  # ids never sampled (e.g. the talker's codec BOS)


@dataclass
class Prompt:
    """Preprocessing output: token ids with placeholders expanded, and encoder inputs (CPU tensors)."""

    input_ids: list[int]
    audio: dict[str, Any] | None = (
        None  # input_features [n, mels, frames], feature_attention_mask [n, frames]
    )
    images: dict[str, Any] | None = None  # pixel_values [patches, dim], image_grid_thw [n, 3]
    videos: dict[str, Any] | None = None  # pixel_values_videos, video_grid_thw, video_second_per_grid
    # The videos' audio tracks are among ``audio``, their tokens interleaved with the video's by
    # time (the processor's use_audio_in_video); rope indexing must know it.
    audio_in_video: bool = False

    @property
    def media_count(self) -> dict[str, int]:
        return {
            "audio": 0 if self.audio is None else int(self.audio["feature_attention_mask"].shape[0]),
            "image": 0 if self.images is None else int(self.images["image_grid_thw"].shape[0]),
            "video": 0 if self.videos is None else int(self.videos["video_grid_thw"].shape[0]),
        }


@dataclass
class ThinkerPrompt:
    """mm_aggregate output: what the thinker prefills, and what the talker needs of the prompt."""

    input_ids: list[int]
    embeds: Any  # [L, H] token embeddings with media embeddings scattered at their placeholders
    positions: Any  # [3, L] mrope position ids
    rope_delta: int  # decode position = cache position + rope_delta
    talker_context: dict[str, Any] = field(default_factory=dict)  # grids / audio lengths for talker rope


@dataclass
class ThinkerAdmission:
    slot: int
    prompt: ThinkerPrompt
    sampling: RowSampling
    want_vectors: bool  # keep per-token vectors for the talker
    # Conversation KV (pipeline/conversation_kv.py): a kept entry of this session (the runner's
    # own object) whose first ``prefix_length`` positions agree with this prompt by ids and
    # positions; the runner checks the media rows, sets ``reused`` to the positions it took from
    # the entry and prefills only the rest.
    prefix: Any = None
    prefix_length: int = 0
    reused: int = 0


@dataclass
class ThinkerStep:
    """One decode step: the next token of rows 0..n-1, and talker vectors of the rows that want them."""

    tokens: list[int]
    vectors: dict[int, Any]  # slot -> [H] thinker reply vector (hidden + input embedding) for the talker


class ThinkerRunner(Protocol):
    slots: int
    max_len: int

    def admit(self, rows: list[ThinkerAdmission]) -> list[tuple[int, Any]]:
        """Prefill rows into their slots; per row (first token, prompt vectors [L, H] or None)."""
        ...

    def step(self, n: int, *, vector_slots: list[int], max_length: int) -> ThinkerStep: ...

    def move(self, src: int, dst: int, length: int) -> None: ...

    def warmup(self) -> None: ...


class PrefixKeeper(Protocol):
    """A thinker runner that can keep a slot's KV between a session's turns (conversation KV)."""

    def keep(self, *, slot: int, length: int, prompt: ThinkerPrompt, vectors: list[Any] | None) -> Any:
        """A copy of the slot's first ``length`` positions (prompt, then fed reply tokens), with
        the talker's vectors (the prompt's [L, H], then one [H] per fed token) or None; the copy
        has ``nbytes``."""
        ...


@dataclass
class TalkerAdmission:
    slot: int
    input_ids: list[int]  # the thinker prompt ids
    talker_context: dict[str, Any]
    prompt_vectors: Any  # [L, H]
    first_token: int  # the thinker's first reply token
    first_vector: Any  # [H] its reply vector
    voice: str
    sampling: RowSampling  # for codec tokens
    # The session's kept talker KV (the runner's copy) whose first ``prefix_length`` positions
    # stand in for this prompt's (conversation KV); None: prefill the whole prompt.
    prefix: Any = None
    prefix_length: int = 0
    # Never sample an end code (stage_params.talker.ignore_eos): the row speaks until its budget.
    ignore_eos: bool = False


class TalkerRunner(Protocol):
    """A code is one codec token (Qwen2.5-Omni) or one frame, a tuple of a token per codebook
    (Qwen3-Omni); a code whose first token is in ``codec_eos_ids`` ends the row."""

    slots: int
    max_len: int
    codec_eos_ids: tuple[int, ...]

    def admit(self, rows: list[TalkerAdmission]) -> list[Any]:
        """Prefill rows; per row the first code."""
        ...

    def prompt_length(self, row: TalkerAdmission) -> int:
        """Cache entries the row's prefill writes (its talker prompt's length)."""
        ...

    def step(self, n: int, *, inputs: list[Any], max_length: int) -> list[Any]:
        """Advance rows 0..n-1 (a code each); ``inputs[i]`` is row i's reply vector, or None to
        hold the row (its entry is None)."""
        ...

    def text_vector(self, kind: str) -> Any:
        """The reply vector fed after the thinker's text ends: ``eos`` once, then ``pad``."""
        ...

    def move(self, src: int, dst: int, length: int) -> None: ...

    def warmup(self) -> None: ...


class KeepingTalkerRunner(TalkerRunner, Protocol):
    """A talker runner that keeps a session's prompt KV between turns (``keeps_kv = True``;
    pipeline/talker.py). Its prompt's first positions are a function of the thinker prompt's first
    positions (their ids and vectors), so a turn whose thinker reused ``n`` kept positions may reuse
    the talker positions those ``n`` cover."""

    keeps_kv: bool

    def kept_length(self, row: TalkerAdmission) -> int:
        """Talker prompt positions kept when the row's turn ends (the part a later turn can share)."""
        ...

    def shared_length(self, row: TalkerAdmission, thinker_positions: int) -> int:
        """Talker prompt positions covered by the thinker prompt's first ``thinker_positions``
        (at most all but the prompt's last)."""
        ...

    def keep(self, *, slot: int, length: int) -> Any:
        """A copy of the slot's first ``length`` positions (the runner's KV format)."""
        ...


def window_shape(item: dict[str, Any]) -> tuple[int, bool]:
    """What a vocoder window item runs as: its context codes (``ctx_end - ctx_start``) and whether
    its size recurs (``reusable``: a captured graph per batch bucket). Windows of one shape run
    together, as one batch; windows of different shapes run one after another."""
    w = item["window"]
    return w["ctx_end"] - w["ctx_start"], bool(item.get("reusable"))


class Vocoder(Protocol):
    sample_rate: int
    samples_per_code: int

    def synthesize(
        self, codes: list[int], *, start: int, end: int, ctx_start: int, ctx_end: int, voice: str, seed: int
    ) -> Any:
        """Audio (float32 numpy, mono, ``sample_rate``) of ``codes[start:end]``, given context codes."""
        ...

    def synthesize_many(self, items: list[dict[str, Any]]) -> list[Any]:
        """Several windows at once (the talker_stream worker's batch); each item has ``codes``,
        ``window`` (start/end/ctx_start/ctx_end), ``voice``, ``seed`` and ``reusable``."""
        ...

    def warmup(self, sizes: frozenset[int]) -> None:
        """Prepare every batch shape of these recurring window sizes (CUDA graphs); may do nothing."""
        ...


class OmniAdapter(ABC):
    """One loaded model family, with the modules of the stages this process hosts."""

    model_name: str
    max_model_len: int
    output_sample_rate: int
    supports_audio_output: bool
    hosted: frozenset[str]
    eos_token_ids: tuple[int, ...]
    voices: tuple[str, ...]
    default_voice: str | None

    @property
    @abstractmethod
    def tokenizer(self) -> Any:
        """Has ``decode(ids, skip_special_tokens=...)``: the decode stage's detokenizer uses it."""

    @abstractmethod
    def preprocess(self, request: GenerationRequest) -> Prompt: ...

    @abstractmethod
    def encode_audio(self, batch: list[dict[str, Any]]) -> list[Any]:
        """Audio features of several requests -> per request, a list of [tokens_i, H] tensors."""

    @abstractmethod
    def encode_vision(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Images/videos of several requests -> per request {"image": [...], "video": [...]} tensors."""

    @abstractmethod
    def aggregate(
        self, prompt: Prompt, *, audio: list[Any], image: list[Any], video: list[Any]
    ) -> ThinkerPrompt: ...

    @abstractmethod
    def thinker_runner(self, *, slots: int, max_len: int) -> ThinkerRunner: ...

    @abstractmethod
    def talker_runner(self, *, slots: int, max_len: int) -> TalkerRunner: ...

    @abstractmethod
    def vocoder(self) -> Vocoder: ...

    def talker_sampling_defaults(self) -> dict[str, Any]:
        return {}

    # Overrides of the segmenter's window sizes (pipeline.segmenter.SegmenterConfig fields), in
    # codes: a family whose codes are longer (Qwen3's 80 ms frames) speaks first after fewer.
    codec_windows: dict[str, Any] = {}
    # Codes (Qwen3: frames) per second of output audio: what a window not yet synthesised will play.
    codes_per_second: float = 50.0

    def thread_initializer(self, stage: str) -> Any:
        """Run once in a stage's worker thread (e.g. to give it its own CUDA stream); None: nothing."""
        return None

    @property
    def captures_cuda_graphs(self) -> bool:
        """Whether decode steps and vocoder windows are captured as CUDA graphs (warm-up covers
        every recurring window size then)."""
        return False

    @property
    def vocoder_shares_thinker_device(self) -> bool:
        """Whether the vocoder shares a GPU with the thinker (the engine then pauses the thinker
        during a request's first audio window)."""
        return False

    @property
    def vision_stage_address(self) -> str | None:
        """host:port of the image encoder's own stage process, when it runs in one."""
        return None

    @property
    def audio_chunk_frames(self) -> int | None:
        """Feature frames the audio tower encodes on their own: an audio's output is its chunks'
        outputs joined, each chunk's depending on its own frames alone. None: an audio is one
        unit. Lets a session's speech be encoded in chunks while the user still speaks."""
        return None

    @property
    def video_groups_independent(self) -> bool:
        """Whether the vision tower encodes each temporal patch group of a video on its own (its
        attention never crosses groups), so a video's groups may be encoded apart and joined."""
        return False

    def close_vision(self) -> None:
        """Stop the image encoder's own processes, if any (idempotent)."""
        return None
