"""Numbers a request sends in free-form fields (``stage_params``): parsed, or an ``EngineError``
that names the field and says what it takes (the API answers it as a 400).

JSON numbers and numeral strings both pass (``"200704"`` as ``200704``), as a value written in a
YAML file or a query string often arrives as a string; booleans never do (``True`` is no count),
nor does a float where a whole number is wanted (``2.5`` codes).
"""

from __future__ import annotations

import math
from typing import Any

from omni_runtime.contract.engine import EngineError

# The largest top-k a request may ask for (chat, streaming input, video, talker): past 2^63 it once
# overflowed the sampler's table and failed every row batched with it (the sampler now takes any
# value at or past the vocabulary as "keep every token"); the bound gives the request its message.
MAX_TOP_K = 2**31 - 1


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for a message, its middle elided past ``limit`` characters (a 400-digit
    number need not come back whole)."""
    text = repr(value)
    return (
        text
        if len(text) <= limit
        else f"{text[: limit // 2]}...{text[-(limit // 2) :]} ({len(text)} characters)"
    )


def whole_number(
    value: Any,
    *,
    field: str,
    least: int,
    most: int | None = None,
    what: str = "a whole number",
    fix: str = "",
) -> int:
    """``value`` as an int of at least ``least`` (and at most ``most``, when given); else a 400
    naming ``field``: "``field`` must be ``what`` >= ``least``, not ``value``" (with "and <=
    ``most``") and, when given, ``; fix``."""
    try:
        number = int(value) if not isinstance(value, (bool, float)) else None
    except (TypeError, ValueError):
        number = None
    if number is None or number < least or (most is not None and number > most):
        span = f">= {least}" + (f" and <= {most}" if most is not None else "")
        raise EngineError(
            f"{field} must be {what} {span}, not {shown(value)}" + (f"; {fix}" if fix else ""), param=field
        )
    return number


def real_number(
    value: Any, *, field: str, low: float, high: float = math.inf, low_open: bool = False
) -> float:
    """``value`` as a finite float in ``[low, high]`` (``(low, high]`` with ``low_open``); else a
    400 naming ``field`` and the range."""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer past float's range
        number = math.nan
    above = number > low if low_open else number >= low
    if not (math.isfinite(number) and above and number <= high):
        bound = f"> {low}" if low_open else f">= {low}"
        span = f"{bound} and <= {high}" if math.isfinite(high) else bound
        raise EngineError(f"{field} must be a number {span}, not {shown(value)}", param=field)
    return number
