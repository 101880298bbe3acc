"""Request checks the engine owns (what the loaded model can serve) and request -> row settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from omni_runtime.contract.adapter import OmniAdapter, RowSampling
from omni_runtime.contract.engine import EngineError, GenerationRequest, SamplingParams
from omni_runtime.contract.params import MAX_TOP_K, real_number, whole_number
from omni_runtime.contract.voices import UnknownVoice, resolve_voice

DEFAULT_TALKER_MAX_TOKENS = 4096
DEFAULT_CODES_PER_TEXT_TOKEN = 30


class ServingEngine(Protocol):
    """What the checks read of the engine (engine.PipelineEngine)."""

    max_model_len: int
    supports_audio_output: bool
    variant: str
    adapter: OmniAdapter | None


def validate_request(request: GenerationRequest, *, engine: ServingEngine) -> str | None:
    """Raise EngineError naming the field for anything this engine cannot serve; return the voice."""
    if not request.turns or not any(t.text or t.media for t in request.turns):
        raise EngineError("messages must contain at least one non-empty message", param="messages")
    sp = request.sampling
    if sp.max_tokens < 1:
        raise EngineError("max_tokens must be at least 1", param="max_tokens")
    if sp.max_tokens > engine.max_model_len:
        raise EngineError(
            f"max_tokens ({sp.max_tokens}) exceeds this model's context ({engine.max_model_len})",
            param="max_tokens",
        )
    if sp.temperature < 0:
        raise EngineError("temperature must be >= 0", param="temperature")
    if not 0.0 < sp.top_p <= 1.0:
        raise EngineError("top_p must be in (0, 1]", param="top_p")
    if not 0.0 <= sp.min_p <= 1.0:
        raise EngineError("min_p must be in [0, 1]", param="min_p")
    if sp.repetition_penalty <= 0:
        raise EngineError("repetition_penalty must be > 0", param="repetition_penalty")
    if not request.want_audio:
        return None
    if not engine.supports_audio_output:
        raise EngineError(
            f"this worker serves the {engine.variant} pipeline and cannot produce audio; ask for "
            'modalities ["text"] or use a worker with the speech pipeline',
            param="modalities",
        )
    talker_limits(request)  # stage_params.talker's values, before any stage runs
    adapter = engine.adapter
    if adapter is not None:
        talker_sampling(request, adapter.talker_sampling_defaults())
    try:
        return resolve_voice(
            request.voice,
            voices=adapter.voices if adapter is not None else (),
            default=adapter.default_voice if adapter is not None else None,
        )
    except UnknownVoice as exc:
        raise EngineError(str(exc), param="audio.voice") from exc


def row_sampling(sp: SamplingParams) -> RowSampling:
    return RowSampling(
        temperature=sp.temperature,
        top_p=sp.top_p,
        top_k=sp.top_k,
        min_p=sp.min_p,
        repetition_penalty=sp.repetition_penalty,
        seed=sp.seed,
    )


@dataclass(frozen=True)
class TalkerLimits:
    """``stage_params.talker``'s length settings."""

    max_codes: int  # max_tokens: codec tokens (frames) at most
    per_text_token: int  # codes_per_text_token: the budget once the text is known
    ignore_eos: bool  # speak exactly max_tokens codes: the end code is never sampled (benchmarks)


def talker_limits(request: GenerationRequest) -> TalkerLimits:
    """Codec-token budget: stage_params.talker.max_tokens, codes allowed per text token, and
    ignore_eos (a fixed length, as the thinker's ``ignore_eos``)."""
    params: dict[str, Any] = dict(request.stage_params.get("talker", {}))
    max_codes = _whole(params, "max_tokens", DEFAULT_TALKER_MAX_TOKENS, least=1)
    per_token = _whole(params, "codes_per_text_token", DEFAULT_CODES_PER_TEXT_TOKEN, least=0)
    ignore_eos = params.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise EngineError(
            f"stage_params.talker.ignore_eos must be true or false, not {ignore_eos!r}",
            param="stage_params.talker.ignore_eos",
        )
    return TalkerLimits(max_codes, per_token, ignore_eos)


def _whole(params: dict[str, Any], key: str, default: int, *, least: int) -> int:
    """``stage_params.talker[key]`` as a whole number of at least ``least`` (a numeral string too)."""
    return whole_number(params.get(key, default), field=f"stage_params.talker.{key}", least=least)


def talker_sampling(request: GenerationRequest, defaults: dict[str, Any]) -> dict[str, Any]:
    """The talker's sampling settings: the family's ``defaults`` with the request's
    ``stage_params.talker`` values for those keys, each checked (a 400 naming the field)."""
    sent: dict[str, Any] = dict(request.stage_params.get("talker", {}))
    params = {**defaults, **{k: v for k, v in sent.items() if k in defaults}}

    def field(key: str) -> str:
        return f"stage_params.talker.{key}"

    checks = {
        "temperature": lambda v: real_number(v, field=field("temperature"), low=0.0),
        "top_k": lambda v: whole_number(v, field=field("top_k"), least=0, most=MAX_TOP_K),
        "top_p": lambda v: real_number(v, field=field("top_p"), low=0.0, high=1.0, low_open=True),
        "repetition_penalty": lambda v: real_number(
            v, field=field("repetition_penalty"), low=0.0, low_open=True
        ),
    }
    return {k: checks[k](v) if k in checks else v for k, v in params.items()}
