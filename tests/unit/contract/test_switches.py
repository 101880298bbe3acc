"""The builtin runtime's environment switches (contract/switches.py): each set value read as the
switch's kind says, a wrong one refused with the variable's name and the fix, never the default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from omni_runtime.contract import switches

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("value", "on"),
    [("", True), ("1", True), ("0", False), ("off", False), ("False", False), (" no ", False), ("YES", True), ("on", True)],
)  # fmt: skip
def test_a_flag_reads_its_words_and_empty_is_its_default(value: str, on: bool) -> None:
    assert switches.flag("OMNI_PREFILL_GRAPHS", {"OMNI_PREFILL_GRAPHS": value}) is on


def test_an_unset_flag_is_its_default() -> None:
    assert switches.flag("OMNI_PREFILL_GRAPHS", {}) is True
    assert switches.flag("OMNI_SUFFIX_GRAPHS", {}) is False


@pytest.mark.parametrize(
    ("environ", "found"),
    [
        ({}, []),
        ({"OMNI_PREFILL_GRAPHS": "false", "OMNI_DECODE_KERNEL": "split", "OMNI_BUSY_STREAMS": "8"}, []),
        ({"OMNI_SUFFIX_GRAPHS": "enabled"},
         ["OMNI_SUFFIX_GRAPHS is 'enabled', not a flag; use 1 or 0 (on/off, true/false and yes/no work too)"]),
        ({"OMNI_VOCODER_DTYPE": "float16"}, ["OMNI_VOCODER_DTYPE is 'float16'; use one of bfloat16, float32"]),
        ({"OMNI_SUFIX_GRAPHS": "1"},
         ["OMNI_SUFIX_GRAPHS is not one of the builtin runtime's switches; did you mean OMNI_SUFFIX_GRAPHS?"]),
        # names far from every switch are not the runtime's (the operator's, a test harness's)
        ({"OMNI_CACHE_DIR": "/cache", "OMNI_E2E": "1", "PATH": "/bin"}, []),
        # a value-kind switch's format is its parser's (pipeline.segmenter, deadlines, window_graphs)
        ({"OMNI_BUSY_STREAMS": "many"}, []),
    ],
)  # fmt: skip
def test_problems_name_the_variable_and_the_fix(environ: dict[str, str], found: list[str]) -> None:
    assert switches.problems(environ) == found


def test_reading_a_wrong_flag_or_choice_raises_the_same_words() -> None:
    with pytest.raises(ValueError, match=r"^OMNI_TORCH_COMPILE is '2', not a flag; use 1 or 0"):
        switches.flag("OMNI_TORCH_COMPILE", {"OMNI_TORCH_COMPILE": "2"})
    with pytest.raises(ValueError, match=r"^OMNI_MOE_EXPERTS is 'fast'; use one of omni_fused, grouped_mm"):
        switches.choice("OMNI_MOE_EXPERTS", environ={"OMNI_MOE_EXPERTS": "fast"})
    assert switches.choice("OMNI_VOCODER_DTYPE", "float32", {}) == "float32"
    assert switches.choice("OMNI_DECODE_KERNEL", environ={}) == "sdpa"


def test_every_switch_the_runtime_reads_is_listed_and_documented() -> None:
    """One definition: the names the runtime's code reads are the registry's, and the README's
    table of switches lists each with its default."""
    read = set()
    for path in (REPO / "runtime" / "omni_runtime").rglob("*.py"):
        if path.name == "switches.py":  # the registry itself
            continue
        read |= set(re.findall(r'"(OMNI_[A-Z_]+)"', path.read_text()))
    read -= {"OMNI_CACHE_DIR"}  # where caches go: set by the operator, not a switch
    assert read == set(switches.BY_NAME)
    readme = (REPO / "README.md").read_text()
    for switch in switches.SWITCHES:
        assert re.search(rf"^\| `{switch.name}` \| {re.escape(switch.default)} \|", readme, re.M), switch.name


def test_every_value_switch_has_its_parser_checked_before_loading() -> None:
    from omni_runtime.entrypoints.switch_values import value_switches

    assert value_switches() == {s.name for s in switches.SWITCHES if s.kind == "value"}


@pytest.mark.parametrize(
    ("environ", "found"),
    [
        ({"OMNI_BUSY_STREAMS": "8", "OMNI_VOCODER_FAR": "1.0,4", "OMNI_STREAM_PRIORITIES": "thinker=-1"}, []),
        ({"OMNI_BUSY_STREAMS": "many"},
         ["OMNI_BUSY_STREAMS must be a whole number of streams >= 0 (0: the short first window at any load), "
          "e.g. '4'; got 'many'"]),
        ({"OMNI_STREAM_PRIORITIES": "thinkr=-1", "OMNI_PACKED_DECODE": "x"},
         ["OMNI_PACKED_DECODE is 'x', not a flag; use 1 or 0 (on/off, true/false and yes/no work too)",
          "OMNI_STREAM_PRIORITIES must be stage=integer pairs like thinker=-2,talker=-1 (stages: thinker, "
          "mm_aggregate, audio_encoder, image_encoder, talker, vocoder); got 'thinkr=-1'"]),
        ({"OMNI_VOCODER_BUCKETS": "2,16"},
         ["OMNI_VOCODER_BUCKETS must be batch sizes in increasing order from 1 to 16, e.g. '1,2,4,6,8,12,16'; "
          "got '2,16'"]),
    ],
)  # fmt: skip
def test_a_worker_refuses_every_wrong_switch_in_the_words_of_its_parser(
    environ: dict[str, str], found: list[str]
) -> None:
    from omni_runtime.entrypoints.switch_values import all_problems

    assert all_problems(environ) == found
