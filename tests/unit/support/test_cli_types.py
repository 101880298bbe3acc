"""Argument types of the runtime's command lines: values, and errors that name the bad value."""

from __future__ import annotations

import argparse
import re

import pytest

from omni_runtime.support.cli_types import arrival_rates, positive_float


@pytest.mark.parametrize(("text", "rates"), [("2", [2.0]), ("0.5, 1,2", [0.5, 1.0, 2.0]), ("1,", [1.0])])
def test_arrival_rates(text: str, rates: list[float]) -> None:
    assert arrival_rates(text) == rates


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "'': arrival rates must be numbers > 0 (requests per second)"),
        ("1,0", "'1,0': arrival rates must be numbers > 0 (requests per second)"),
        ("nan", "'nan': arrival rates must be numbers > 0 (requests per second)"),
        ("two", "'two' is not a comma list of numbers, e.g. 0.5,1,2"),
    ],
)
def test_arrival_rates_name_the_bad_value(text: str, error: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"^{re.escape(error)}$"):
        arrival_rates(text)


def test_positive_float_names_the_bad_value() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"^0 must be greater than 0$"):
        positive_float("0")
