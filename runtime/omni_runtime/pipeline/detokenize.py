"""The decode stage's pure parts: incremental detokenization and stop strings.

Byte-level BPE splits multi-byte characters across tokens, so decoding token by token would emit
U+FFFD halves of a character. The detokenizer decodes a small window of recent tokens and emits
only text that has become stable (the same trick vLLM and TGI use), holding back a trailing
replacement character until the next token completes it. The stop matcher holds back any text
that could still become the start of a stop string, so a client never sees half a stop string.
"""

from __future__ import annotations

from typing import Protocol

_REPLACEMENT = "\ufffd"


class Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas that are always whole characters."""

    def __init__(self, tokenizer: Decoder, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0  # window start: decoding from here gives stable leading text
        self._read_offset = 0  # tokens before this have been emitted as text

    @property
    def token_ids(self) -> list[int]:
        return list(self._ids)

    def push(self, token_id: int) -> str:
        """Add one token; return the text that became final (may be empty)."""
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of generation: return what is still held back, even a lone U+FFFD."""
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) <= len(prefix) or (full.endswith(_REPLACEMENT) and not final):
            return ""  # nothing new, or a character still incomplete
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full[len(prefix) :]

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)


class StopMatcher:
    """Finds the first stop string in a text stream and holds back possible stop prefixes."""

    def __init__(self, stops: tuple[str, ...] | list[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Add text; return what is safe to emit. After a stop string, ``stopped`` is True."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        buffer = self._held + text
        hits = [(buffer.find(s), s) for s in self._stops]
        hits = [(i, s) for i, s in hits if i >= 0]
        if hits:
            self.stopped = True
            self._held = ""
            return buffer[: min(i for i, _ in hits)]
        keep = self._longest_stop_prefix_suffix(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """Generation ended without a stop string: release the held-back tail."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _longest_stop_prefix_suffix(self, buffer: str) -> int:
        """Length of the longest suffix of ``buffer`` that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(buffer)), best, -1):
                if buffer.endswith(stop[:n]):
                    best = n
                    break
        return best
