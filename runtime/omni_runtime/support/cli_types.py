"""Argument types shared by the runtime's command lines (`omni serve`, `omni stage`, `omni bench`)."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An integer >= 1, with an argparse error that names the bad value."""
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value
