"""The builtin runtime's environment switches: every ``OMNI_*`` variable it reads, in one place.

A switch is a flag (``1``/``0``; ``on``/``off``, ``true``/``false``, ``yes``/``no`` too), a choice of
names, or a value with a format of its own, parsed here (`read`) into plain values the module that
uses it turns into its own objects. ``omni serve`` and ``omni stage`` check every switch set in
their environment before loading anything (`problems`), and so does ``omni plan`` for an
OmniDeployment's ``spec.runtime.env`` (builtin runtime), with the same words: a wrong value stops
the start with the variable's name and the fix instead of silently meaning the default
(``OMNI_PREFILL_GRAPHS=false`` used to keep the graphs on, since only ``0`` turned them off). A
name one letter off a switch's is caught the same way.
"""

from __future__ import annotations

import difflib
import itertools
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["flag", "choice", "value"]

# A vocoder call's batch buckets (models.window_graphs pads a batch of windows up to one of them);
# the largest is the most windows of one size a call takes.
VOCODER_BATCH_BUCKETS = (1, 2, 4, 8, 16)
# The stage threads that get a CUDA stream (models.qwen2_5_omni.placement), by OMNI_STREAM_PRIORITIES' names.
STREAM_STAGES = ("thinker", "mm_aggregate", "audio_encoder", "image_encoder", "talker", "vocoder")


def _streams(text: str) -> int:
    streams = int(text)
    if streams < 0:
        raise ValueError
    return streams


def _buckets(text: str) -> tuple[int, ...]:
    buckets = tuple(int(part) for part in text.split(","))
    if buckets[0] != 1 or buckets[-1] != VOCODER_BATCH_BUCKETS[-1]:
        raise ValueError
    if any(b >= c for b, c in itertools.pairwise(buckets)):
        raise ValueError
    return buckets


def _far(text: str) -> tuple[float, int, bool] | str:
    if text.strip() == "off":
        return "off"
    after_s, batch, *near = (part.strip() for part in text.split(","))
    if float(after_s) < 0 or int(batch) < 1 or near not in ([], ["near"]):
        raise ValueError
    return float(after_s), int(batch), near == ["near"]


def _gather(text: str) -> float:
    ms = float(text)
    if not 0 <= ms <= 1000:
        raise ValueError
    return ms


def _priorities(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in text.split(","):
        stage, _, value = part.partition("=")
        if stage.strip() not in STREAM_STAGES:
            raise ValueError
        out[stage.strip()] = int(value)
    return out


_PRIORITY = rf"({'|'.join(STREAM_STAGES)})\s*=\s*[+-]?\d+"  # one stage=integer of OMNI_STREAM_PRIORITIES


@dataclass(frozen=True)
class Switch:
    name: str
    kind: Kind
    default: str  # what unset means, in the switch's own words
    summary: str
    choices: tuple[str, ...] = ()  # a choice's names
    example: str = ""  # a value's format, by example
    # A value's parser (raises ValueError on a wrong one) and what a wrong one is not.
    parse: Callable[[str], Any] | None = None
    format: str = ""
    # A value's written form, a regular expression that RE2 (the CRD's CEL rules) and Python read
    # alike: checked before the parser, so `kubectl apply` refuses what omni serve would.
    shape: str = ""


SWITCHES: tuple[Switch, ...] = (
    Switch(
        "OMNI_BUSY_STREAMS",
        "value",
        "the family's (Qwen2.5-Omni: 4)",
        "From how many streaming speech replies in flight a reply's first audio window is the longer one "
        "(less stall under load, about 0.1 s later first audio); 0: never. Qwen2.5-Omni only (Qwen3-Omni "
        "has no longer first window).",
        example="4",
        parse=_streams,
        format="not a whole number of streams >= 0 (0: the short first window at any load)",
        shape=r"\d+",
    ),
    Switch(
        "OMNI_WARM_SPOKEN_AUDIO",
        "flag",
        "1",
        "Realtime: prefill each whole chunk of the user's speech into the session's KV while they speak.",
    ),
    Switch(
        "OMNI_SUFFIX_GRAPHS",
        "flag",
        "1",
        "CUDA graphs (captured at start-up) for a turn's prefill after a kept conversation prefix.",
    ),
    Switch("OMNI_PREFILL_GRAPHS", "flag", "1", "CUDA graphs for prompt prefill."),
    Switch("OMNI_TORCH_COMPILE", "flag", "1", "torch.compile the decoder layers and the vocoder on a GPU."),
    Switch("OMNI_COMPILE_PREFILL", "flag", "1", "With OMNI_TORCH_COMPILE, compile the prefill path too."),
    Switch(
        "OMNI_PACKED_DECODE",
        "flag",
        "1",
        "Decode attention over the packed KV heads; 0: transformers' copy of the cache per query head.",
    ),
    Switch(
        "OMNI_CUDNN_ATTENTION",
        "flag",
        "0",
        "Keep cuDNN's attention kernels (each new shape plans for up to seconds; off by default).",
    ),
    Switch(
        "OMNI_DECODE_KERNEL",
        "choice",
        "sdpa",
        "Decode attention kernel: PyTorch's SDPA, or split (split-key Triton kernels; not yet measured).",
        choices=("sdpa", "split"),
    ),
    Switch(
        "OMNI_VOCODER_DTYPE",
        "choice",
        "bfloat16 on a GPU, float32 on CPU",
        "The Qwen2.5-Omni vocoder's precision.",
        choices=("bfloat16", "float32"),
    ),
    Switch(
        "OMNI_VOCODER_BUCKETS",
        "value",
        "1,2,4,8,16",
        "Batch sizes a vocoder call is padded to (one CUDA graph each per window size).",
        example="1,2,4,6,8,12,16",
        parse=_buckets,
        format=f"not batch sizes in increasing order from 1 to {VOCODER_BATCH_BUCKETS[-1]}",
        shape=r"\d+(\s*,\s*\d+)*",
    ),
    Switch(
        "OMNI_VOCODER_FAR",
        "value",
        "off",
        "SECONDS,WINDOWS[,near]: windows with more than SECONDS of audio still to play go at most WINDOWS a "
        "call (with near: only while some stream has less than SECONDS left); off: no bound.",
        example="1.0,4,near",
        parse=_far,
        format="not SECONDS,WINDOWS[,near] or off (seconds of audio left >= 0, windows per call >= 1)",
        shape=r"off|(\d+(\.\d*)?|\.\d+)\s*,\s*\d+(\s*,\s*near)?",
    ),
    Switch(
        "OMNI_STREAM_PRIORITIES",
        "value",
        "talker=-2,vocoder=-1",
        "CUDA stream priority per stage (lower is served first; stages not named: 0).",
        example="thinker=-2,talker=-1",
        parse=_priorities,
        format=f"not stage=integer pairs (stages: {', '.join(STREAM_STAGES)})",
        shape=_PRIORITY + r"(\s*,\s*" + _PRIORITY + ")*",
    ),
    Switch(
        "OMNI_SHARED_PREFIX",
        "flag",
        "0",
        "Keep prompt prefixes' thinker KV across requests (a system prompt prefilled once per worker, in "
        "--session-kv-mb; opt-in, not yet measured on a GPU).",
    ),
    Switch(
        "OMNI_GATHER_MS",
        "value",
        "0 (off)",
        "An idle thinker holds a burst's first prompts up to this many ms while more requests are in their "
        "prompt phase, so the burst prefills as one batch (opt-in; not yet measured on a GPU).",
        example="15",
        parse=_gather,
        format="not a number of milliseconds from 0 to 1000",
        shape=r"\d+(\.\d*)?|\.\d+",
    ),
    Switch(
        "OMNI_MOE_EXPERTS",
        "choice",
        "omni_fused for the thinker where Triton is installed, else grouped_mm",
        "Qwen3-Omni's MoE experts kernel.",
        choices=("omni_fused", "grouped_mm", "batched_mm", "eager"),
    ),
    Switch(
        "OMNI_MOE_LAYER",
        "choice",
        "pdl",
        "Qwen3-Omni thinker decode steps of up to 4 rows on a GPU: six Triton kernels a layer as programmatic "
        "dependent launches (pdl; fused before Hopper), the same launched plainly (fused), or the compiled "
        "transformers layer (off).",
        choices=("pdl", "fused", "off"),
    ),
    Switch(
        "OMNI_THINKER_AHEAD",
        "choice",
        "auto",
        "Queue each thinker decode step before the previous one's tokens are read while the batch stays "
        "as it is and no row feeds a talker (auto: on a GPU; on: on a CPU too, where it only delays each "
        "token by a step; off).",
        choices=("auto", "on", "off"),
    ),
    Switch(
        "OMNI_MOE_ROW_KERNEL",
        "flag",
        "1",
        "Qwen3-Omni thinker decode steps of one row on Hopper or later: the MoE block (router, experts, "
        "residual) as one CUDA kernel and the o projection as another (its rows copied into shared memory "
        "during the attention), compiled at start by NVRTC; 0: the Triton kernels.",
    ),
    Switch(
        "OMNI_STEP_INPUTS_KERNEL",
        "flag",
        "1",
        "A decode step's write positions, rotary cos and sin and attention mask in one Triton kernel and "
        "its final RMSNorm in another (on a CUDA GPU, where they match the model's modules, checked at "
        "start); 0: the modules' PyTorch kernels.",
    ),
    Switch(
        "OMNI_MOE_STEP_KERNEL",
        "flag",
        "0",
        "Qwen3-Omni thinker decode steps of one row on Hopper or later: every layer in one CUDA kernel "
        "compiled at start by NVRTC (1; measured slower than the four kernels a layer on an H200, kept for "
        "development); 0: four kernels a layer.",
    ),
)
BY_NAME = {switch.name: switch for switch in SWITCHES}

_ON = ("1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")
FLAG_FIX = "use 1 or 0 (on/off, true/false and yes/no work too)"
NOT_A_FLAG = "not a flag"  # a flag's reason: "is 'maybe', not a flag"


def choice_fix(switch: Switch) -> str:
    return f"use one of {', '.join(switch.choices)}"


def pattern(switch: Switch) -> str:
    """A regular expression (RE2 and Python alike) of the values `problem` takes for a flag or a
    choice, blank included (the default), and of a value's written form (empty: unset; its parser
    still checks what the form cannot, e.g. buckets in increasing order): the CRD's CEL rules
    check spec.runtime.env with it."""
    if switch.kind == "value":
        return rf"^(\s*({switch.shape})\s*)?$"
    words = _ON + _OFF if switch.kind == "flag" else switch.choices
    case = "(?i:" if switch.kind == "flag" else "("
    return rf"^\s*{case}{'|'.join(words)})?\s*$"


def problem(name: str, value: str) -> tuple[str, str] | None:
    """What is wrong with ``name=value`` as (reason, fix), or None. Checks a switch's value (empty:
    its default) and a name close to a switch's that is not one; other names are not the runtime's
    to judge."""
    switch = BY_NAME.get(name)
    if switch is None:
        if name.startswith("OMNI_") and (close := difflib.get_close_matches(name, BY_NAME, n=1, cutoff=0.85)):
            return "is not one of the builtin runtime's switches", f"did you mean {close[0]}?"
        return None
    word = value.strip().lower()
    if switch.kind == "flag" and word and word not in _ON + _OFF:
        return f"is {value!r}, {NOT_A_FLAG}", FLAG_FIX
    if switch.kind == "choice" and value.strip() and value.strip() not in switch.choices:
        return f"is {value!r}", choice_fix(switch)
    if switch.parse is not None and value:
        try:
            if not re.match(pattern(switch), value):
                raise ValueError
            switch.parse(value)
        except (ValueError, IndexError):
            return f"is {value!r}, {switch.format}", f"use e.g. {switch.example}"
    return None


def problems(environ: Mapping[str, str]) -> list[str]:
    """Every set variable's `problem`, as ``NAME reason; fix``."""
    found = []
    for name, value in environ.items():
        if (wrong := problem(name, value)) is not None:
            found.append(f"{name} {wrong[0]}; {wrong[1]}")
    return found


def flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """A flag switch's value: its default when unset or empty. A wrong value raises ValueError
    with `problem`'s words (``omni serve`` has refused it before this is read)."""
    switch = BY_NAME[name]
    assert switch.kind == "flag", name
    value = (os.environ if environ is None else environ).get(name, "")
    if (p := problem(name, value)) is not None:
        raise ValueError(f"{name} {p[0]}; {p[1]}")
    word = value.strip().lower() or switch.default
    return word in _ON


def choice(name: str, default: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """A choice switch's value: ``default`` (else the switch's own) when unset or empty."""
    switch = BY_NAME[name]
    assert switch.kind == "choice", name
    value = (os.environ if environ is None else environ).get(name, "").strip()
    if (p := problem(name, value)) is not None:
        raise ValueError(f"{name} {p[0]}; {p[1]}")
    return value or (default if default is not None else switch.default)


def read(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """A value switch's parsed value (``OMNI_VOCODER_FAR``: a (seconds, windows) pair, and so on),
    or None when unset or empty; a wrong value raises ValueError in `problem`'s words."""
    return parse(name, (os.environ if environ is None else environ).get(name, ""))


def parse(name: str, value: str | None) -> Any:
    """`read` of a given value (None or empty: None)."""
    switch = BY_NAME[name]
    assert switch.parse is not None, name
    if not value:
        return None
    if (p := problem(name, value)) is not None:
        raise ValueError(f"{name} {p[0]}; {p[1]}")
    return switch.parse(value)
