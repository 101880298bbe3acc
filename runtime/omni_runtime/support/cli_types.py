"""Argument types shared by the runtime's command lines (`omni serve`, `omni stage`, `omni bench`)."""

from __future__ import annotations

import argparse


def _int_at_least(text: str, minimum: int, bound: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from exc
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text} must be {bound}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1, with an argparse error that names the bad value."""
    return _int_at_least(text, 1, "at least 1")


def non_negative_int(text: str) -> int:
    """An integer >= 0 (0 usually meaning "no limit"), with an argparse error that names the bad value."""
    return _int_at_least(text, 0, "0 or more (0: off)")


def positive_float(text: str) -> float:
    """A number > 0, with an argparse error that names the bad value."""
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from exc
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be greater than 0")
    return value


def arrival_rates(text: str) -> list[float]:
    """A comma list of arrival rates (requests a second, each > 0), e.g. ``0.5,1,2``."""
    try:
        rates = [float(p) for p in text.split(",") if p.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of numbers, e.g. 0.5,1,2") from exc
    if not rates or any(not r > 0 for r in rates):
        raise argparse.ArgumentTypeError(f"{text!r}: arrival rates must be numbers > 0 (requests per second)")
    return rates
