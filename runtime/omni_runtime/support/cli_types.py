"""Argument types shared by the runtime's command lines (`omni serve`, `omni stage`, `omni bench`)."""

from __future__ import annotations

import argparse


def _int_at_least(text: str, minimum: int, rule: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from exc
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text} {rule}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1, with an argparse error that names the bad value."""
    return _int_at_least(text, 1, "must be at least 1")


def non_negative_int(text: str) -> int:
    """An integer >= 0 (0 usually meaning off), with an argparse error that names the bad value."""
    return _int_at_least(text, 0, "must not be negative")
