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
    assert switches.flag("OMNI_SUFFIX_GRAPHS", {}) is True
    assert switches.flag("OMNI_WARM_SPOKEN_AUDIO", {}) is True
    assert switches.flag("OMNI_CUDNN_ATTENTION", {}) is False


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


@pytest.mark.parametrize(
    ("environ", "found"),
    [
        ({"OMNI_BUSY_STREAMS": "8", "OMNI_VOCODER_FAR": "1.0,4", "OMNI_STREAM_PRIORITIES": "thinker=-1"}, []),
        ({"OMNI_BUSY_STREAMS": "many"},
         ["OMNI_BUSY_STREAMS is 'many', not a whole number of streams >= 0 (0: the short first window at any "
          "load); use e.g. 4"]),
        ({"OMNI_STREAM_PRIORITIES": "thinkr=-1", "OMNI_PACKED_DECODE": "x"},
         ["OMNI_STREAM_PRIORITIES is 'thinkr=-1', not stage=integer pairs (stages: thinker, mm_aggregate, "
          "audio_encoder, image_encoder, talker, vocoder); use e.g. thinker=-2,talker=-1",
          "OMNI_PACKED_DECODE is 'x', not a flag; use 1 or 0 (on/off, true/false and yes/no work too)"]),
        ({"OMNI_VOCODER_BUCKETS": "2,16"},
         ["OMNI_VOCODER_BUCKETS is '2,16', not batch sizes in increasing order from 1 to 16; use e.g. "
          "1,2,4,6,8,12,16"]),
        ({"OMNI_VOCODER_FAR": " "},
         ["OMNI_VOCODER_FAR is ' ', not SECONDS,WINDOWS[,near] or off (seconds of audio left >= 0, windows per "
          "call >= 1); use e.g. 1.0,4,near"]),
    ],
)  # fmt: skip
def test_a_wrong_value_switch_names_itself_its_format_and_an_example(
    environ: dict[str, str], found: list[str]
) -> None:
    assert switches.problems(environ) == found


@pytest.mark.parametrize(
    ("name", "value", "parsed"),
    [
        ("OMNI_BUSY_STREAMS", "0", 0),
        ("OMNI_BUSY_STREAMS", "", None),
        ("OMNI_VOCODER_BUCKETS", "1,2,4,6,8,12,16", (1, 2, 4, 6, 8, 12, 16)),
        ("OMNI_VOCODER_FAR", "0,1", (0.0, 1, False)),
        ("OMNI_VOCODER_FAR", "1.0,4,near", (1.0, 4, True)),
        ("OMNI_VOCODER_FAR", "off", "off"),
        ("OMNI_STREAM_PRIORITIES", "thinker=-2, talker=-1", {"thinker": -2, "talker": -1}),
        ("OMNI_GATHER_MS", "15", 15.0),
        ("OMNI_GATHER_MS", "0.5", 0.5),
    ],
)
def test_read_gives_a_value_switchs_plain_value(name: str, value: str, parsed: object) -> None:
    assert switches.read(name, {name: value}) == parsed
    assert switches.read(name, {}) is None


def test_every_value_switch_has_a_parser_a_format_and_an_example() -> None:
    for switch in switches.SWITCHES:
        assert (switch.parse is not None) == (switch.kind == "value"), switch.name
        if switch.kind == "value":
            assert switch.format and switch.example, switch.name
            assert switches.parse(switch.name, switch.example) is not None


@pytest.mark.parametrize(
    ("name", "value", "wrong"),
    [
        ("OMNI_BUSY_STREAMS", " 8 ", False),
        ("OMNI_BUSY_STREAMS", "", False),  # unset: the default
        ("OMNI_BUSY_STREAMS", "+4", True),  # int() takes it; the written form (and CEL) does not
        ("OMNI_BUSY_STREAMS", "4_0", True),
        ("OMNI_VOCODER_BUCKETS", "1, 2,4 ,16", False),
        ("OMNI_VOCODER_BUCKETS", "1,,16", True),
        ("OMNI_VOCODER_BUCKETS", "1,8,4,16", True),  # the form holds; the parser's order does not
        ("OMNI_VOCODER_FAR", ".5,2", False),
        ("OMNI_VOCODER_FAR", "1.,2", False),
        ("OMNI_VOCODER_FAR", "1e3,4", True),
        ("OMNI_VOCODER_FAR", "1.0,0", True),  # windows per call >= 1: the parser's
        ("OMNI_VOCODER_FAR", " 1.0 , 4 , near ", False),
        ("OMNI_VOCODER_FAR", "off", False),
        ("OMNI_VOCODER_FAR", "1.0,4,", True),
        ("OMNI_VOCODER_FAR", "near", True),
        ("OMNI_STREAM_PRIORITIES", "thinker=-2, talker = +1", False),
        ("OMNI_STREAM_PRIORITIES", "talker=-1,", True),
        ("OMNI_STREAM_PRIORITIES", "talker=-1;vocoder=0", True),
        ("OMNI_GATHER_MS", "0", False),  # off, spelled out
        ("OMNI_GATHER_MS", ".5", False),
        ("OMNI_GATHER_MS", "1001", True),  # at most a second: the parser's
        ("OMNI_GATHER_MS", "-1", True),
        ("OMNI_GATHER_MS", "15ms", True),
    ],
)
def test_a_value_switch_is_checked_by_its_written_form_then_its_parser(
    name: str, value: str, wrong: bool
) -> None:
    """The form (`pattern`, which the CRD's CEL rule uses too) is checked before the parser, so
    `kubectl apply` refuses no value `omni serve` takes, and a value off the form is refused by both."""
    switch = switches.BY_NAME[name]
    assert (switches.problem(name, value) is not None) == wrong
    if re.match(switches.pattern(switch), value) is None:
        assert wrong
    if not wrong:
        assert value == "" or switches.parse(name, value) is not None


def test_every_value_switchs_example_has_its_written_form() -> None:
    for switch in switches.SWITCHES:
        if switch.kind == "value":
            assert switch.shape and re.match(switches.pattern(switch), switch.example), switch.name
            assert not re.match(switches.pattern(switch), " "), switch.name  # blank is no value
