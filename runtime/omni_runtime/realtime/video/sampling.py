"""Per-stage sampling parameters of a streaming video session, checked before any query runs.

vLLM-Omni's clients send ``sampling_params_list``: one dict per pipeline stage, in pipeline order
``[thinker, talker, code2wav]``; fewer entries leave the later stages at their defaults. Our
engine takes the same thing as ``SamplingParams`` (the thinker) plus ``stage_params`` keyed by
stage name (``talker``; ``talker_stream`` is our vocoder, vLLM-Omni's ``code2wav``), which a
session may also send directly, as on the chat API. Every value is type- and range-checked when
it arrives (``session.config`` or ``video.query``), so a bad one is an ``error`` event naming the
field (``sampling_params_list[1].temperature``) and never reaches the query worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from omni_runtime.contract.engine import SamplingParams
from omni_runtime.contract.params import MAX_TOP_K
from omni_runtime.contract.stages import Stage
from omni_runtime.realtime.errors import ProtocolError, invalid
from omni_runtime.realtime.request_types import Flag, Int, Number, Text

# Position in sampling_params_list -> our stage; the released names label positions in errors.
LIST_STAGES: tuple[tuple[Stage, str], ...] = (
    (Stage.thinker, "thinker"),
    (Stage.talker, "talker"),
    (Stage.talker_stream, "code2wav"),
)
STAGE_NAMES: dict[str, Stage] = {
    "thinker": Stage.thinker,
    "talker": Stage.talker,
    "talker_stream": Stage.talker_stream,
    "code2wav": Stage.talker_stream,
}
# What each stage applies; the other accepted keys are checked but have no effect there (a
# copied vLLM stage config carries them, e.g. the vocoder's temperature or ``detokenize``).
_TALKER_KEYS = (
    "max_tokens",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "codes_per_text_token",
    "ignore_eos",
)


class StageSampling(BaseModel):
    """One stage's entry: the vLLM SamplingParams fields this worker knows, strictly typed."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    max_tokens: Int | None = Field(
        default=None, ge=1, validation_alias=AliasChoices("max_tokens", "max_new_tokens")
    )
    temperature: Number | None = Field(default=None, ge=0.0, le=2.0)
    top_p: Number | None = Field(default=None, gt=0.0, le=1.0)
    top_k: Int | None = Field(default=None, ge=-1, le=MAX_TOP_K)
    min_p: Number | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: Number | None = Field(default=None, gt=0.0, le=2.0)
    seed: Int | None = None
    stop: Text | list[Text] | None = None
    ignore_eos: Flag | None = None
    codes_per_text_token: Int | None = Field(default=None, ge=1)  # talker: codec tokens per text token
    # Accepted for copied vLLM stage configs; no effect on this worker.
    detokenize: Flag | None = None
    skip_special_tokens: Flag | None = None
    stop_token_ids: list[Int] | None = None

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if stop == "" or (isinstance(stop, list) and "" in stop):
            raise ValueError("stop strings must not be empty (an empty one would end every reply at once)")
        return stop


ACCEPTED_KEYS = ", ".join(sorted({*StageSampling.model_fields, "max_new_tokens"}))


@dataclass(frozen=True)
class VideoSampling:
    """What a query hands the engine: the thinker's SamplingParams and the other stages' params."""

    sampling: SamplingParams
    stage_params: dict[str, dict[str, object]] = field(default_factory=dict)


def field_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a client writes it: ``sampling_params_list[1].temperature``."""
    out = ""
    for part in loc:
        if isinstance(part, str) and ("[" in part or "-" in part):
            continue  # a union member's tag, such as 'list[str]': not a field the client wrote
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "config"


def validation_error(exc: ValidationError, *, prefix: str = "") -> ProtocolError:
    """The first field's pydantic error as an ``invalid_value`` error naming the field.

    A union (``stop``: a string or a list of strings) reports one error per member; the deepest
    one names the element at fault (``stop[0]``).
    """
    errors = exc.errors()
    field_errors = [e for e in errors if e["loc"][:1] == errors[0]["loc"][:1]]
    first = max(field_errors, key=lambda e: len(e["loc"]))
    path = field_path(first["loc"])
    path = f"{prefix}.{path}" if prefix else path
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        message = f"unknown sampling parameter; accepted: {ACCEPTED_KEYS}"
    elif "input" in first and first["type"].endswith(("_type", "_parsing")):
        message = f"{message} (got {first['input']!r})"
    return invalid(path, message)


def _stage_entries(
    sampling_params_list: Any, stage_params: Any, *, where: str
) -> dict[Stage, tuple[str, Any]]:
    """Raw entries by stage, each with the field path it came from."""
    if sampling_params_list is not None and stage_params is not None:
        raise invalid("stage_params", "send either sampling_params_list or stage_params, not both")
    entries: dict[Stage, tuple[str, Any]] = {}
    if sampling_params_list is not None:
        if not isinstance(sampling_params_list, list):
            raise invalid(
                "sampling_params_list",
                "expected a list of objects, one per stage: [thinker, talker, code2wav]",
            )
        if len(sampling_params_list) > len(LIST_STAGES):
            raise invalid(
                "sampling_params_list",
                f"{len(sampling_params_list)} entries; this pipeline has {len(LIST_STAGES)} stages "
                f"[{', '.join(name for _, name in LIST_STAGES)}]",
            )
        for index, entry in enumerate(sampling_params_list):
            entries[LIST_STAGES[index][0]] = (f"sampling_params_list[{index}]", entry)
    if stage_params is not None:
        if not isinstance(stage_params, dict):
            raise invalid(
                "stage_params", "expected an object keyed by stage name (thinker, talker, code2wav)"
            )
        for name, entry in stage_params.items():
            stage = STAGE_NAMES.get(name)
            if stage is None:
                raise invalid(
                    f"stage_params.{name}", f"unknown stage; stages are {', '.join(sorted(STAGE_NAMES))}"
                )
            if stage in entries:
                raise invalid(f"stage_params.{name}", f"{where} names this stage twice")
            entries[stage] = (f"stage_params.{name}", entry)
    return entries


def resolve_sampling(
    sampling_params_list: Any,
    stage_params: Any = None,
    *,
    default_max_tokens: int,
    max_model_len: int,
    where: str = "session.config",
) -> VideoSampling:
    """Validate the per-stage params and map them onto the engine's request fields."""
    parsed: dict[Stage, StageSampling] = {}
    for stage, (path, entry) in _stage_entries(sampling_params_list, stage_params, where=where).items():
        if not isinstance(entry, dict):
            raise invalid(path, f"expected an object of sampling parameters, got {type(entry).__name__}")
        try:
            parsed[stage] = StageSampling.model_validate(entry)
        except ValidationError as exc:
            raise validation_error(exc, prefix=path) from exc
    thinker = parsed.get(Stage.thinker, StageSampling())
    max_tokens = thinker.max_tokens if thinker.max_tokens is not None else default_max_tokens
    if max_tokens > max_model_len:
        path = _stage_path(sampling_params_list, Stage.thinker)
        raise invalid(
            f"{path}.max_tokens", f"{max_tokens} is above the model's context of {max_model_len} tokens"
        )
    values = thinker.model_dump(exclude_none=True, include=set(SamplingParams.__dataclass_fields__))
    stop = values.pop("stop", ())
    values["max_tokens"] = max_tokens
    sampling = SamplingParams(stop=(stop,) if isinstance(stop, str) else tuple(stop), **values)
    stages: dict[str, dict[str, object]] = {}
    talker = parsed.get(Stage.talker)
    if talker is not None:
        stages[Stage.talker.value] = talker.model_dump(exclude_none=True, include=set(_TALKER_KEYS))
    vocoder = parsed.get(Stage.talker_stream)
    if vocoder is not None:
        stages[Stage.talker_stream.value] = vocoder.model_dump(exclude_none=True)
    return VideoSampling(sampling=sampling, stage_params=stages)


def _stage_path(sampling_params_list: Any, stage: Stage) -> str:
    return "sampling_params_list[0]" if sampling_params_list is not None else f"stage_params.{stage.value}"
