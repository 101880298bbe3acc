"""Outgoing events of one realtime session: ids, dialect, epoch filtering and replay.

Every server event goes through `Outbox.emit`, which stamps an ordered ``event_id``, renames it for
clients of the beta protocol (or, for duplex bridges, only the audio events: `event_renames`), serialises it once and queues it for the socket's sender. Deltas of a
response carry the epoch they were produced in; when the user barges in the session bumps the
epoch, and the sender drops every queued delta of an older epoch, so no audio of a cancelled
response reaches the client after the cancellation. Duplex sessions also keep a bounded log of
sent events, so a client that reconnects with its resume token gets what it missed.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# GA name -> beta name. Beta clients (OpenAI-Beta: realtime=v1) get the names they know.
_BETA_NAMES = {
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "conversation.item.added": "conversation.item.created",
}
_BETA_SKIP = frozenset({"conversation.item.done"})
# Duplex bridges (the native /v1/duplex socket): GA everywhere except the audio unit pair.
_DUPLEX_NAMES = {name: beta for name, beta in _BETA_NAMES.items() if name.startswith("response.output_audio")}
_BETA_PART_TYPES = {"output_text": "text", "output_audio": "audio"}
EVENT_PREFIX = "event_"


def _beta_content(value: Any) -> Any:
    """Rename GA content-part types inside items (``output_text`` -> ``text``) for beta clients."""
    if isinstance(value, dict):
        out = {key: _beta_content(item) for key, item in value.items()}
        if isinstance(out.get("content"), list):
            for part in out["content"]:
                if isinstance(part, dict) and part.get("type") in _BETA_PART_TYPES:
                    part["type"] = _BETA_PART_TYPES[part["type"]]
        return out
    if isinstance(value, list):
        return [_beta_content(item) for item in value]
    return value


def event_renames(*, beta: bool, duplex_names: bool) -> dict[str, str]:
    """GA event name -> the name this client gets (names not listed are sent as they are)."""
    if beta:
        return dict(_BETA_NAMES)
    return dict(_DUPLEX_NAMES) if duplex_names else {}


def sequence_of(event_id: str) -> int | None:
    if not event_id.startswith(EVENT_PREFIX):
        return None
    digits = event_id[len(EVENT_PREFIX) :]
    return int(digits) if digits.isdigit() else None


@dataclass
class _Queued:
    seq: int
    epoch: int | None
    text: str


class Outbox:
    def __init__(
        self,
        *,
        beta: bool,
        keep_log: bool,
        max_log_events: int,
        max_log_bytes: int,
        on_stale: Callable[[], None] | None = None,
        duplex_names: bool = False,
    ) -> None:
        self.beta = beta
        self._renames = event_renames(beta=beta, duplex_names=duplex_names)
        self.epoch = 0
        self._seq = 0
        self._queue: asyncio.Queue[_Queued | None] = asyncio.Queue()
        self._keep_log = keep_log
        self._log: deque[_Queued] = deque()
        self._log_bytes = 0
        self._max_log_events = max_log_events
        self._max_log_bytes = max_log_bytes
        self._on_stale = on_stale
        self.attached = True

    def emit(self, event_type: str, *, epoch: int | None = None, **fields: Any) -> str | None:
        """Queue one event; ``epoch`` marks a delta that a barge-in may make stale. Returns its id."""
        if self.beta:
            if event_type in _BETA_SKIP:
                return None
            fields = _beta_content(fields)
        event_type = self._renames.get(event_type, event_type)
        self._seq += 1
        event_id = f"{EVENT_PREFIX}{self._seq}"
        body: dict[str, Any] = {"type": event_type, "event_id": event_id, **fields}
        if epoch is not None:
            body["epoch"] = epoch
        queued = _Queued(seq=self._seq, epoch=epoch, text=json.dumps(body, separators=(",", ":")))
        if self._keep_log:
            self._log.append(queued)
            self._log_bytes += len(queued.text)
            while self._log and (
                len(self._log) > self._max_log_events or self._log_bytes > self._max_log_bytes
            ):
                self._log_bytes -= len(self._log.popleft().text)
        if self.attached:
            self._queue.put_nowait(queued)
        return event_id

    def bump_epoch(self) -> int:
        self.epoch += 1
        return self.epoch

    def _stale(self, queued: _Queued) -> bool:
        return queued.epoch is not None and queued.epoch < self.epoch

    async def next_text(self) -> str | None:
        """The next event to send (stale deltas skipped); None once the outbox is closed."""
        while True:
            queued = await self._queue.get()
            if queued is None:
                return None
            if self._stale(queued):
                if self._on_stale is not None:
                    self._on_stale()
                continue
            return queued.text

    def ready_texts(self) -> list[str]:
        """Everything sendable that is queued now, without waiting (stale deltas dropped)."""
        texts: list[str] = []
        while not self._queue.empty():
            queued = self._queue.get_nowait()
            if queued is None:
                self._queue.put_nowait(None)  # keep the close marker for the sender
                break
            if self._stale(queued):
                if self._on_stale is not None:
                    self._on_stale()
                continue
            texts.append(queued.text)
        return texts

    def close(self) -> None:
        self._queue.put_nowait(None)

    def detach(self) -> None:
        """The socket is gone: stop queueing (the log keeps what a resumed client will need)."""
        self.attached = False
        self._queue = asyncio.Queue()

    def attach(self, *, last_event_id: str | None) -> tuple[int, bool]:
        """A resumed socket: queue the logged events after ``last_event_id``.

        Returns how many were replayed and whether the log still reached back far enough.
        """
        self._queue = asyncio.Queue()
        self.attached = True
        last = sequence_of(last_event_id) if last_event_id else 0
        last = last or 0
        complete = not self._log or self._log[0].seq <= last + 1
        replayed = 0
        for queued in self._log:
            if queued.seq > last and not self._stale(queued):
                self._queue.put_nowait(queued)
                replayed += 1
        return replayed, complete
