"""Strict field types of the request models (chat completions, streaming input), and the text check.

JSON clients send numbers as numbers and flags as booleans: ``"max_tokens": "4"`` or
``"sequence_id": "1"`` is a client bug, refused rather than guessed at. Text must be valid
Unicode: JSON can spell a lone surrogate (``"\\ud800"``), which no tokenizer and no UTF-8 encoder
takes, so it is refused where it arrives, naming the field, instead of failing deep in the worker.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Strict

from omni_runtime.realtime.errors import PROMPT_TOO_LONG, ProtocolError, invalid

LONE_SURROGATE = "contains a lone UTF-16 surrogate (such as \\ud800), which is not valid Unicode text"


def lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a code point no UTF-8 encoder takes (D800-DFFF)."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _valid_text(text: str) -> str:
    if lone_surrogate(text):
        raise ValueError(LONE_SURROGATE)
    return text


Text = Annotated[str, Strict(), AfterValidator(_valid_text)]
Int = Annotated[int, Strict()]
Number = Annotated[float, Strict()]  # takes JSON integers too
Flag = Annotated[bool, Strict()]


def too_long(param: str, *, chars: int, max_chars: int) -> ProtocolError:
    message = (
        f"{param}: {chars} characters of text, more than this worker's context can take (at most {max_chars})"
    )
    return ProtocolError(f"{message}; send less text", code=PROMPT_TOO_LONG, param=param)


def check_text(text: str, *, param: str, max_chars: int) -> str:
    """Text a socket event or a chunk carries: valid Unicode and at most ``max_chars`` long."""
    if lone_surrogate(text):
        raise invalid(param, LONE_SURROGATE)
    if len(text) > max_chars:
        raise too_long(param, chars=len(text), max_chars=max_chars)
    return text
