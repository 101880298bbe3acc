"""Which thinker positions Qwen3-Omni's talker reads (talker_prompt.py): exact tables.

Token ids: 1 = <|im_start|>, 2 = <|im_end|>, 10 = system, 11 = user, 12 = assistant, 9 = a newline,
20+ = content, 99 = tts_pad. A position belongs to the turn named by the token after the latest
<|im_start|> at or before it, as ``Qwen3OmniMoeForConditionalGeneration.generate`` decides.
"""

from __future__ import annotations

import pytest

from omni_runtime.models.qwen3_omni_moe.talker_prompt import (
    ASSISTANT_PART,
    TurnTokens,
    assistant_start,
    talker_prompt_ids,
    user_positions,
)

TOKENS = TurnTokens(im_start=1, user=11, assistant=12)
ONE_TURN = [1, 11, 9, 20, 21, 2, 9, 1, 12, 9]
WITH_SYSTEM = [1, 10, 9, 30, 2, 9, *ONE_TURN]
MULTI_TURN = [1, 11, 9, 20, 2, 9, 1, 12, 9, 40, 41, 2, 9, 1, 11, 9, 22, 2, 9, 1, 12, 9]


@pytest.mark.parametrize(
    ("ids", "users", "start"),
    [
        (ONE_TURN, [0, 1, 2, 3, 4, 5, 6], 7),
        (WITH_SYSTEM, [6, 7, 8, 9, 10, 11, 12], 13),  # the system turn is left out
        # Both user turns, not the earlier assistant reply; the last assistant header starts at 19.
        (MULTI_TURN, [0, 1, 2, 3, 4, 5, 13, 14, 15, 16, 17, 18], 19),
        ([20, 21, 1, 12, 9], [], 2),  # text before any <|im_start|> takes the role at index 1 (21)
        ([20, 11, 22, 1, 12, 9], [0, 1, 2], 3),  # ... which here names the user: generate's rule
        ([1, 11, 9, 20], [0, 1, 2, 3], -1),  # no assistant header
    ],
    ids=["one-turn", "system", "multi-turn", "no-start-other", "no-start-user", "no-header"],
)
def test_user_positions_and_assistant_start(ids: list[int], users: list[int], start: int) -> None:
    assert user_positions(ids, TOKENS) == users
    assert assistant_start(ids, TOKENS) == start


def test_talker_prompt_ids_are_the_user_tokens_then_one_pad_per_assistant_slot() -> None:
    assert ASSISTANT_PART == 9
    assert talker_prompt_ids(WITH_SYSTEM, TOKENS, tts_pad=99) == [1, 11, 9, 20, 21, 2, 9] + [99] * 9
    assert talker_prompt_ids([1, 12, 9], TOKENS, tts_pad=99) == [99] * 9
