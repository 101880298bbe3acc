"""The conversation-KV prefix rule and store (pipeline/conversation_kv.py) as exact tables.

Token streams are written as a chat template renders them (symbolic ids): S = system text,
``<`` / ``>`` turn markers, U/A = user/assistant turn roles, u*/a* = text, M = a media
placeholder. A kept entry is the previous prompt plus the reply tokens the row fed; the next
prompt is the history re-rendered after the client's edits.
"""

from __future__ import annotations

import numpy as np
import pytest

from omni_runtime.pipeline.conversation_kv import (
    ConversationKV,
    KeptPrefix,
    decode_positions,
    positions_of,
    reusable_length,
)

IDS = {
    name: i
    for i, name in enumerate(
        ["<", ">", "S", "U", "A", "u1", "u2", "u3", "a1", "a2", "a3", "a4", "b1", "b2", "M", "x"]
    )
}


def ids(text: str) -> list[int]:
    return [IDS[t] for t in text.split()]


def flat(n: int, start: int = 0) -> list[list[int]]:
    """Text positions: the same on all three mrope axes."""
    return [list(range(start, start + n))] * 3


SYSTEM = "< S > "
TURN1 = SYSTEM + "< U u1 u2 > < A "
REPLY1 = "a1 a2 a3"
KEPT = TURN1 + REPLY1  # prompt of turn 1 + the fed reply (the final EOS is never fed)
NEXT = KEPT + " > < U u3 > < A "


@pytest.mark.parametrize(
    ("case", "new", "expected"),
    [
        # The next turn appends to the history: everything kept is reused.
        ("next turn", NEXT, len(ids(KEPT))),
        # conversation.item.truncate / playback.ack trim the reply to what was heard: the kept
        # tokens past the cut are ignored, the rest is reused.
        ("reply truncated", TURN1 + "a1 a2 > < U u3 > < A ", len(ids(TURN1 + "a1 a2"))),
        ("reply truncated to nothing", TURN1 + "> < U u3 > < A ", len(ids(TURN1))),
        # The reply re-tokenised differently from the sampled ids: stops at the first difference.
        ("reply re-tokenised", TURN1 + "a1 a4 a3 > < U u3 > < A ", len(ids(TURN1 + "a1"))),
        # conversation.item.delete of the user's turn: only the system prompt survives.
        ("user item deleted", SYSTEM + "< A " + REPLY1 + " > < U u3 > < A ", len(ids(SYSTEM + "<"))),
        # conversation.item.delete of the assistant's reply.
        ("reply deleted", SYSTEM + "< U u1 u2 > < U u3 > < A ", len(ids(SYSTEM + "< U u1 u2 > <"))),
        # session.update instructions: the system prompt changed at its first token.
        ("instructions changed", "< x > < U u1 u2 > < A ", 1),
        # The context window dropped the oldest turn: nothing in common past the system prompt.
        ("oldest turn dropped", SYSTEM + "< U u3 > < A ", len(ids(SYSTEM + "< U"))),
        # The same prompt again (a retried response): all but the last token, whose logits are needed.
        ("same prompt again", TURN1, len(ids(TURN1)) - 1),
        # A prompt shorter than the kept entry, inside it.
        ("inside the kept entry", TURN1 + "a1", len(ids(TURN1))),
        ("empty kept entry", "< x", 0),
    ],
)
def test_reusable_length_follows_the_first_changed_token(case: str, new: str, expected: int) -> None:
    kept, fresh = ids(KEPT if case != "empty kept entry" else ""), ids(new)
    assert (
        reusable_length(
            kept_ids=kept,
            kept_positions=positions_of(flat(len(kept)), len(kept)),
            new_ids=fresh,
            new_positions=flat(len(fresh)),
        )
        == expected
    ), case


def test_positions_must_agree_too() -> None:
    """Same ids, media geometry moved the mrope positions (a video's seconds per grid): the
    prefix stops at the first position that differs, on any axis."""
    kept = ids("< U M M M > < A a1")
    new = ids("< U M M M > < A a1 > <")
    kept_pos = [[0, 1, 2, 2, 2, 5, 6, 7, 8], [0, 1, 2, 3, 3, 5, 6, 7, 8], [0, 1, 2, 3, 4, 5, 6, 7, 8]]
    new_pos = [[*row, 9, 10] for row in kept_pos]
    new_pos[0] = [0, 1, 2, 4, 4, 6, 7, 8, 9, 10, 11]  # the temporal axis moved at index 3
    common = dict(kept_ids=kept, kept_positions=positions_of(kept_pos, len(kept)), new_ids=new)
    assert reusable_length(**common, new_positions=[[*row, 9, 10] for row in kept_pos]) == len(kept)
    assert reusable_length(**common, new_positions=new_pos) == 3


def test_reply_tokens_sit_at_cache_position_plus_rope_delta() -> None:
    # A prompt of 4 whose media compressed positions (rope_delta -2): fed tokens at 4, 5 sit at 2, 3.
    assert decode_positions(4, 6, -2).tolist() == [[2, 3], [2, 3], [2, 3]]
    assert positions_of([[0, 1, 1, 1], [0, 1, 2, 2], [0, 1, 2, 3]], 3).tolist() == [
        [0, 1, 1],
        [0, 1, 2],
        [0, 1, 2],
    ]


def entry(nbytes: int, n: int = 4) -> KeptPrefix:
    return KeptPrefix(
        ids=np.arange(n),
        positions=decode_positions(0, n, 0),
        payload=None,
        nbytes=nbytes,
        has_vectors=False,
    )


def test_store_evicts_least_recently_used_sessions_by_bytes() -> None:
    store = ConversationKV(100)
    store.put("a", entry(40))
    store.put("b", entry(40))
    assert store.take("a") is not None  # a turn of "a" admitted: its entry leaves the store
    store.put("a", entry(40))  # ... and comes back when the turn ends: "a" is now the newest
    store.put("c", entry(40))  # room for c: "b" (least recent) goes
    assert ("a" in store, "b" in store, "c" in store) == (True, False, True)
    store.put("d", entry(101))  # larger than the whole budget: never kept
    assert "d" not in store
    counters = store.counters()
    assert (counters.entries, counters.bytes, counters.evictions, counters.capacity_bytes) == (2, 80, 2, 100)
    assert store.drop("a") is True and store.drop("a") is False
    assert store.counters().bytes == 40


def test_store_counts_hits_and_reused_tokens() -> None:
    store = ConversationKV(1 << 20)
    store.note_admission(reused=0, prompt_tokens=50)
    store.note_admission(reused=48, prompt_tokens=70)
    counters = store.counters()
    assert (counters.hits, counters.misses, counters.reused_tokens, counters.prefilled_tokens) == (
        1,
        1,
        48,
        72,
    )


def test_a_zero_budget_disables_the_store() -> None:
    store = ConversationKV(0)
    assert not store.enabled
    store.put("a", entry(1))
    assert "a" not in store


def prompt_entry(tokens: list[int], nbytes: int = 10, vectors: bool = False) -> KeptPrefix:
    return KeptPrefix(
        ids=np.asarray(tokens),
        positions=decode_positions(0, len(tokens), 0),
        payload=None,
        nbytes=nbytes,
        has_vectors=vectors,
    )


SYSTEM_20 = list(range(100, 120))  # a 20-token system prompt with the template's opening


def test_a_shared_prefix_serves_every_prompt_that_starts_with_it_and_stays() -> None:
    store = ConversationKV(1000)
    assert store.share(prompt_entry([*SYSTEM_20, 1, 2, 3]))
    for user in ([4, 5], [6, 7, 8, 9]):
        new = SYSTEM_20 + user
        found = store.shared_prefix(new, flat(len(new)), vectors=False)
        assert found is not None and found[1] == 20  # up to the first token that differs
    counters = store.counters()
    assert (counters.entries, counters.shared_entries) == (0, 1)  # used twice, never taken out


@pytest.mark.parametrize(
    ("new", "vectors", "expected"),
    [
        ([*SYSTEM_20[:15], 1, 2], False, None),  # 15 tokens in common: under SHARED_MIN_TOKENS
        ([*SYSTEM_20, 1, 2, 3], False, 22),  # all but the last token (always prefilled)
        ([*SYSTEM_20, 9], True, None),  # a speech row needs the talker's vectors: this entry has none
        ([7, *SYSTEM_20], False, None),  # differs at the first token
    ],
)
def test_shared_prefix_table(new: list[int], vectors: bool, expected: int | None) -> None:
    store = ConversationKV(1000)
    store.share(prompt_entry([*SYSTEM_20, 1, 2, 3]))
    found = store.shared_prefix(new, flat(len(new)), vectors=vectors)
    assert (None if found is None else found[1]) == expected


def test_a_burst_of_one_system_prompt_keeps_one_entry_and_the_longest_wins() -> None:
    store = ConversationKV(1000)
    assert store.share(prompt_entry([*SYSTEM_20, 1, 2]))
    assert not store.share(prompt_entry([*SYSTEM_20, 3, 4]))  # covered 20 of 22: not kept again
    longer = SYSTEM_20 + list(range(200, 240))  # a long shared instruction after the system prompt
    assert store.share(prompt_entry([*longer, 5]))  # covered 20 of 61: kept
    found = store.shared_prefix([*longer, 6, 7], flat(len(longer) + 2), vectors=False)
    assert found is not None and found[1] == len(longer)
    assert (store.counters().entries, store.counters().shared_entries) == (0, 2)


def test_shared_prefixes_and_sessions_share_the_bytes_least_recent_first() -> None:
    store = ConversationKV(30)
    store.share(prompt_entry([*SYSTEM_20, 1], nbytes=10))
    store.put("a", entry(10))
    store.put("b", entry(10))
    store.put("c", entry(10))  # the shared entry is the least recently used: it goes
    assert store.shared_prefix([*SYSTEM_20, 2], flat(21), vectors=False) is None
    assert (store.counters().entries, store.counters().shared_entries) == (3, 0) and "a" in store


def test_prompts_that_share_nothing_keep_at_most_eight_shared_entries() -> None:
    from omni_runtime.pipeline.conversation_kv import SHARED_MAX_ENTRIES

    store = ConversationKV(10_000)
    store.put("session", entry(10))
    for i in range(20):  # each prompt its own: every one is kept, the oldest shared ones go
        assert store.share(prompt_entry([1000 + i, *SYSTEM_20], nbytes=10))
    counters = store.counters()
    assert (counters.entries, counters.shared_entries) == (1, SHARED_MAX_ENTRIES) and "session" in store
    newest = [1019, *SYSTEM_20, 5]
    assert store.shared_prefix(newest, flat(len(newest)), vectors=False) is not None
    oldest = [1000, *SYSTEM_20, 5]
    assert store.shared_prefix(oldest, flat(len(oldest)), vectors=False) is None
