"""Conversation-lifetime KV: a session's thinker KV kept between its turns, and the prefix rule.

A realtime or duplex session (or chat requests with one ``X-Session-Id``) sends its whole
conversation every turn. When a turn's thinker row ends, the scheduler keeps the row's KV (the
prompt plus the reply tokens the row fed) under the session key; the next turn of that session
reuses the longest prefix of its prompt that is *exactly* what the kept KV was computed from, and
prefills only the rest.

What must agree, position by position, for a kept entry to stand in for a prefill (the KV of
position ``i`` is a function of the layer inputs at positions ``0..i`` only, causal attention):

1. the token id (system prompt, the chat template's turn markers, the reply as tokenised again
   from history: a reply the tokenizer splits differently stops the prefix there);
2. the mrope position triple (Qwen's 3D positions: media geometry — audio lengths, image grids,
   a video's seconds per grid — moves them without changing the ids; reply tokens kept by decode
   steps sit at ``cache position + rope_delta`` on all three axes, which a re-prefill of the same
   text reproduces);
3. the input embedding at every media placeholder (same id, different audio): checked by the
   runner on the device, bit for bit (``executor/kept_kv.py``).

Truncation, deletion and barge-in trims need no bookkeeping of their own: they change the
history, the re-rendered prompt diverges at the first changed token, and everything kept past
that point is ignored (the entry is replaced by the new turn's KV when that turn ends). The last
prompt token is always prefilled (its logits give the first reply token). An entry is taken out
of the store when a turn of its session is admitted, so two concurrent requests of one session
never share a kept row; the loser simply prefills in full.

The store is bounded by bytes (``--session-kv-mb``, 0 disables it) and evicts the least recently
used session first; an evicted session's next turn is a full prefill, never a wrong prefix.

*Shared prefixes* (``OMNI_SHARED_PREFIX``, opt-in): the same store also keeps the prompt KV of a
request that reused nothing, under a key of its own, and any later request (of no session, or a
session's first turn) reuses the longest exact prefix one of those covers, at least
``SHARED_MIN_TOKENS``: the system prompt and the chat template's opening, prefilled once per
worker instead of once per request. Unlike a session's entry, a shared one is not taken out when a
request uses it (the runner only copies from it), and one that an entry already covers is not kept
again when one covers half of it. The rule and the bound are the sessions': the same bytes, least
recently used first; and at most ``SHARED_MAX_ENTRIES`` shared entries, so prompts that share
nothing (no system prompt, each its own) cannot crowd the sessions out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class KeptPrefix:
    """One session's kept thinker KV and what it was computed from (event-loop side)."""

    ids: np.ndarray  # [n] token ids of the kept positions: prompt, then the reply tokens fed
    positions: np.ndarray  # [3, n] their mrope positions
    payload: Any  # the runner's device copy (executor.kept_kv.KeptKV)
    nbytes: int
    has_vectors: bool  # kept the talker's per-position vectors too (speech turns)

    @property
    def length(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class KVCounters:
    entries: int = 0
    bytes: int = 0
    capacity_bytes: int = 0
    hits: int = 0  # admissions that reused a kept prefix
    misses: int = 0  # admissions of a session turn that prefilled in full
    reused_tokens: int = 0  # prompt tokens served from kept KV instead of a prefill
    prefilled_tokens: int = 0  # prompt tokens of session turns that were prefilled
    evictions: int = 0  # entries dropped for room (or too large to keep)
    shared_entries: int = 0  # shared prompt prefixes kept (OMNI_SHARED_PREFIX); not in ``entries``
    shared_hits: int = 0  # admissions that reused a shared prefix
    shared_tokens: int = 0  # prompt tokens those admissions took from shared prefixes


def common_length(kept: Any, new: Any) -> int:
    """How many leading positions two sequences share (``[k, n]`` arrays: on every row). Vectorised:
    a long conversation is compared on the event loop at each admission."""
    a, b = np.asarray(kept), np.asarray(new)
    limit = min(a.shape[-1], b.shape[-1])
    differs = a[..., :limit] != b[..., :limit]
    if differs.ndim > 1:
        differs = differs.any(axis=0)
    where = np.flatnonzero(differs)
    return int(where[0]) if where.size else limit


def positions_of(positions: Any, count: int) -> np.ndarray:
    """The first ``count`` columns of a ``[3, L]`` position tensor (or nested list), ``[3, count]``."""
    if hasattr(positions, "cpu"):  # a torch tensor, without importing torch here
        positions = positions.cpu()
    return np.asarray(positions, dtype=np.int64)[:, :count]


def decode_positions(start: int, stop: int, rope_delta: int) -> np.ndarray:
    """Positions ``[3, n]`` of tokens fed by decode steps at cache positions ``start..stop-1``:
    the same on all three axes."""
    return np.tile(np.arange(start, stop, dtype=np.int64) + rope_delta, (3, 1))


def reusable_length(*, kept_ids: Any, kept_positions: Any, new_ids: Sequence[int], new_positions: Any) -> int:
    """Prompt tokens of a new turn that a kept entry covers exactly (ids and positions; media
    rows are the runner's check). Never the whole prompt: its last token is always prefilled."""
    limit = common_length(kept_ids, list(new_ids[: max(len(new_ids) - 1, 0)]))
    if limit == 0:
        return 0
    return common_length(np.asarray(kept_positions)[:, :limit], positions_of(new_positions, limit))


SHARED_MIN_TOKENS = 16  # the least a shared prefix must cover to stand in for a prefill
SHARED_MAX_ENTRIES = 8  # shared entries at most: prompts with nothing in common never crowd out sessions
_SHARED = "\x00shared:"  # shared prefixes' keys (no session key starts with a NUL)


class ConversationKV:
    """Kept prefixes by session key, LRU-bounded by bytes (event-loop side only)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = max(0, capacity_bytes)
        self._entries: OrderedDict[str, KeptPrefix] = OrderedDict()
        self._bytes = 0
        self.hits = self.misses = self.reused_tokens = self.prefilled_tokens = self.evictions = 0
        self._shared_keys = 0
        self.shared_hits = self.shared_tokens = 0  # admissions that used a shared prefix, their tokens

    def shared_prefix(
        self, ids: Sequence[int], positions: Any, *, vectors: bool
    ) -> tuple[KeptPrefix, int] | None:
        """The shared entry that covers most of a prompt (at least ``SHARED_MIN_TOKENS``) and how
        much, marked recently used; None: none does. ``vectors``: the row needs the talker's."""
        best: tuple[str, KeptPrefix, int] | None = None
        for key, entry in self._entries.items():
            if not key.startswith(_SHARED) or (vectors and not entry.has_vectors):
                continue
            length = reusable_length(
                kept_ids=entry.ids, kept_positions=entry.positions, new_ids=ids, new_positions=positions
            )
            if length >= SHARED_MIN_TOKENS and (best is None or length > best[2]):
                best = (key, entry, length)
        if best is None:
            return None
        self._entries.move_to_end(best[0])
        return best[1], best[2]

    def covered(self, ids: Sequence[int], positions: Any, *, vectors: bool) -> bool:
        """Whether a shared entry already covers half of this prompt (``share`` would not keep it)."""
        found = self.shared_prefix(ids, positions, vectors=vectors)
        return found is not None and found[1] >= max(SHARED_MIN_TOKENS, len(ids) // 2)

    def share(self, entry: KeptPrefix) -> bool:
        """Keep a prompt's KV as a shared prefix, unless a shared entry already covers half of it
        (a burst's prompts differ only after the system prompt: one entry for them all); True when
        kept."""
        if self.covered(entry.ids.tolist(), entry.positions, vectors=entry.has_vectors):
            return False
        shared = [key for key in self._entries if key.startswith(_SHARED)]  # least recent first
        for key in shared[: max(0, len(shared) - SHARED_MAX_ENTRIES + 1)]:
            self.take(key)
            self.evictions += 1
        self._shared_keys += 1
        self.put(f"{_SHARED}{self._shared_keys}", entry)
        return True

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def __contains__(self, session: str) -> bool:
        return session in self._entries

    def take(self, session: str) -> KeptPrefix | None:
        """Remove and return a session's entry (its next turn is being admitted)."""
        entry = self._entries.pop(session, None)
        if entry is not None:
            self._bytes -= entry.nbytes
        return entry

    def put(self, session: str, entry: KeptPrefix) -> None:
        """Keep ``entry`` as the session's newest; older sessions make room, least recent first."""
        self.take(session)
        if entry.nbytes > self.capacity:
            self.evictions += 1
            return
        while self._entries and self._bytes + entry.nbytes > self.capacity:
            _, old = self._entries.popitem(last=False)
            self._bytes -= old.nbytes
            self.evictions += 1
        self._entries[session] = entry
        self._bytes += entry.nbytes

    def drop(self, session: str) -> bool:
        """Forget a session (closed); True when it had an entry."""
        return self.take(session) is not None

    def note_admission(self, *, reused: int, prompt_tokens: int) -> None:
        if reused > 0:
            self.hits += 1
        else:
            self.misses += 1
        self.reused_tokens += reused
        self.prefilled_tokens += prompt_tokens - reused

    def counters(self) -> KVCounters:
        shared = sum(1 for key in self._entries if key.startswith(_SHARED))
        return KVCounters(
            entries=len(self._entries) - shared,
            bytes=self._bytes,
            capacity_bytes=self.capacity,
            hits=self.hits,
            misses=self.misses,
            reused_tokens=self.reused_tokens,
            prefilled_tokens=self.prefilled_tokens,
            evictions=self.evictions,
            shared_entries=shared,
            shared_hits=self.shared_hits,
            shared_tokens=self.shared_tokens,
        )
