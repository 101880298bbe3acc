"""Which thinker positions Qwen3-Omni's talker reads, and the ids of its prompt (pure logic).

``Qwen3OmniMoeForConditionalGeneration.generate`` builds the talker's prompt from two parts of
the thinker's sequence: every position of the *user* turns (a position's turn is named by the
token after the latest ``<|im_start|>`` at or before it; system and earlier assistant turns are
left out), and the last assistant header ``<|im_start|>assistant\\n`` with the first reply token.
The talker's rope positions come from the user tokens followed by one ``tts_pad`` id per
assistant-part position (``ASSISTANT_PART``): 3 header tokens, 4 pads, the text BOS and the
first reply token, summed with ``codec_nothink, think_bos, think_eos, speaker, codec_pad,
codec_bos`` on the last six.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ASSISTANT_HEADER = 3  # <|im_start|> assistant \n
ASSISTANT_PART = 9  # header, 4 x tts_pad, tts_bos, first reply token


@dataclass(frozen=True)
class TurnTokens:
    im_start: int
    user: int
    assistant: int


def user_positions(ids: Sequence[int], tokens: TurnTokens) -> list[int]:
    """Positions of ``ids`` inside user turns (the turn's ``<|im_start|>`` and role token included).

    As generate: a position's role token is the one after the latest ``<|im_start|>`` at or
    before it (positions before any take the token at index 1)."""
    out, latest = [], 0
    for i, token in enumerate(ids):
        if token == tokens.im_start:
            latest = i
        role = ids[min(latest + 1, len(ids) - 1)]
        if role == tokens.user:
            out.append(i)
    return out


def assistant_start(ids: Sequence[int], tokens: TurnTokens) -> int:
    """Index of the last ``<|im_start|>`` followed by the assistant role token; -1 if none."""
    for i in range(len(ids) - 2, -1, -1):
        if ids[i] == tokens.im_start and ids[i + 1] == tokens.assistant:
            return i
    return -1


def talker_prompt_ids(ids: Sequence[int], tokens: TurnTokens, *, tts_pad: int) -> list[int]:
    """The ids the talker's rope indexing sees: user tokens, then ``tts_pad`` per assistant-part slot."""
    return [ids[i] for i in user_positions(ids, tokens)] + [tts_pad] * ASSISTANT_PART
