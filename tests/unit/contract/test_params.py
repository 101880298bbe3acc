"""contract.params: free-form request numbers parsed, or a 400 naming the field (exact tables)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from omni_runtime.contract.engine import ChatTurn, EngineError, GenerationRequest
from omni_runtime.contract.params import real_number, whole_number
from omni_runtime.pipeline.validate import talker_sampling


@pytest.mark.parametrize(
    ("value", "least", "expected"),
    [(0, 0, 0), (7, 1, 7), ("12", 1, 12), (" 3 ", 1, 3), (-2, -5, -2)],
)
def test_whole_numbers_pass(value: Any, least: int, expected: int) -> None:
    assert whole_number(value, field="f", least=least) == expected


@pytest.mark.parametrize(
    ("value", "least", "fix", "message"),
    [
        (0, 1, "", "f must be a whole number >= 1, not 0"),
        (2.5, 0, "", "f must be a whole number >= 0, not 2.5"),
        (3.0, 0, "", "f must be a whole number >= 0, not 3.0"),
        (True, 0, "", "f must be a whole number >= 0, not True"),
        ("1e3", 0, "", "f must be a whole number >= 0, not '1e3'"),
        (None, 0, "send 4", "f must be a whole number >= 0, not None; send 4"),
        ([1], 0, "", "f must be a whole number >= 0, not [1]"),
        (  # a long value comes back elided
            "-" + "9" * 400,
            0,
            "",
            f"f must be a whole number >= 0, not '-{'9' * 28}...{'9' * 29}' (403 characters)",
        ),
    ],
)
def test_whole_number_refusals_name_the_field(value: Any, least: int, fix: str, message: str) -> None:
    with pytest.raises(EngineError) as err:
        whole_number(value, field="f", least=least, fix=fix)
    assert (str(err.value), err.value.param) == (message, "f")


@pytest.mark.parametrize(
    ("value", "kwargs", "expected"),
    [
        (0, {"low": 0.0}, 0.0),
        ("0.7", {"low": 0.0}, 0.7),
        (1, {"low": 0.0, "high": 1.0, "low_open": True}, 1.0),
        (1e-9, {"low": 0.0, "low_open": True}, 1e-9),
    ],
)
def test_real_numbers_pass(value: Any, kwargs: dict[str, Any], expected: float) -> None:
    assert real_number(value, field="g", **kwargs) == expected


@pytest.mark.parametrize(
    ("value", "kwargs", "message"),
    [
        (-0.1, {"low": 0.0}, "g must be a number >= 0.0, not -0.1"),
        (0, {"low": 0.0, "low_open": True}, "g must be a number > 0.0, not 0"),
        (1.5, {"low": 0.0, "high": 1.0, "low_open": True}, "g must be a number > 0.0 and <= 1.0, not 1.5"),
        ("nan", {"low": 0.0}, "g must be a number >= 0.0, not 'nan'"),
        (math.inf, {"low": 0.0}, "g must be a number >= 0.0, not inf"),
        (False, {"low": 0.0}, "g must be a number >= 0.0, not False"),
        ({"a": 1}, {"low": 0.0}, "g must be a number >= 0.0, not {'a': 1}"),
    ],
)
def test_real_number_refusals_name_the_field(value: Any, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(EngineError) as err:
        real_number(value, field="g", **kwargs)
    assert (str(err.value), err.value.param) == (message, "g")


DEFAULTS = {"temperature": 0.9, "top_k": 40, "top_p": 0.8, "repetition_penalty": 1.05}


def _request(talker: dict[str, Any]) -> GenerationRequest:
    return GenerationRequest(
        request_id="r", turns=(ChatTurn(role="user", text="hi"),), stage_params={"talker": talker}
    )


@pytest.mark.parametrize(
    ("talker", "expected"),
    [
        ({}, DEFAULTS),
        ({"temperature": "0", "top_k": "5"}, {**DEFAULTS, "temperature": 0.0, "top_k": 5}),
        ({"top_p": 1, "max_tokens": 9}, {**DEFAULTS, "top_p": 1.0}),  # max_tokens: talker_limits's
    ],
)
def test_talker_sampling_merges_and_parses(talker: dict[str, Any], expected: dict[str, Any]) -> None:
    assert talker_sampling(_request(talker), DEFAULTS) == expected
