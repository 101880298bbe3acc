"""The playback cursor of a realtime session: what the client reports having played, per item.

A duplex client reports playback with ``playback.ack`` — vLLM-Omni's spelling ``{played_ms,
response_id?, item_id?}`` or ours ``{item_id, audio_end_ms}``. The cursor decides what assistant
audio (and its share of transcript) enters history whenever playback is cut short: a VAD
barge-in, a ``response.cancel``, or user speech over a reply that finished generating but is still
playing (`duplex_policy.played_for_history` is the rule). An acknowledgement never edits history
by itself, so ``conversation.item.truncate`` keeps its OpenAI meaning.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from omni_runtime.realtime.errors import ProtocolError, invalid, missing
from omni_runtime.realtime.session.conversation import Conversation
from omni_runtime.realtime.session.duplex_policy import played_for_history

if TYPE_CHECKING:
    from omni_runtime.realtime.session.response import ResponseRun

MAX_REMEMBERED = 64


class PlaybackCursor:
    def __init__(self) -> None:
        self.acks: dict[str, int] = {}  # item id -> audio ms the client reported playing
        self.client_acks = False  # this client speaks playback.ack
        self._items: OrderedDict[str, str] = OrderedDict()  # response id -> its item id

    def started(self, run: ResponseRun) -> None:
        self._items[run.id] = run.item.id
        while len(self._items) > MAX_REMEMBERED:
            self._items.popitem(last=False)

    def ack(
        self, event: dict[str, Any], *, conversation: Conversation, current: ResponseRun | None
    ) -> dict[str, Any]:
        """Record one ``playback.ack``; returns the fields of its ``playback.acknowledged``."""
        name = "played_ms" if "played_ms" in event else "audio_end_ms"
        played = event.get(name)
        if played is None:
            raise missing("played_ms", where="playback.ack")
        if (
            isinstance(played, bool)
            or not isinstance(played, int | float)
            or (isinstance(played, float) and not math.isfinite(played))  # NaN, Infinity, 1e400
            or played < 0
        ):
            raise invalid(name, "expected the played position in milliseconds (a finite number >= 0)")
        item_id, response_id = event.get("item_id"), event.get("response_id")
        if item_id is not None and not isinstance(item_id, str):
            raise invalid("item_id", "expected an item id")
        if response_id is not None and not isinstance(response_id, str):
            raise invalid("response_id", "expected a response id")
        if item_id is None and response_id is not None:
            item_id = self._items.get(response_id)
            if item_id is None:
                raise ProtocolError(
                    f"no response {response_id!r} on this session to acknowledge",
                    code="playback_item_not_found",
                    param="response_id",
                )
        if item_id is None:
            if current is None:
                raise missing("item_id", where="playback.ack")
            item_id = current.item.id
        conversation.get(item_id)
        self.acks[item_id] = int(played)
        self.client_acks = True
        return {"item_id": item_id, "response_id": response_id, "played_ms": int(played)}

    def played_ms(self, run: ResponseRun, now: float) -> int:
        """How much of ``run``'s audio enters history if playback stops at ``now``."""
        return played_for_history(
            acked_ms=self.acks.get(run.item.id),
            client_acks=self.client_acks,
            estimate_ms=run.played_estimate_ms(now),
            total_ms=run.item.output_audio_ms() or int(run.audio_ms),
        )

    def still_playing(self, run: ResponseRun | None, now: float) -> bool:
        """Whether a finished reply's audio is still coming out of the client's speaker."""
        if run is None or not run.plan.want_audio or run.audio_ms <= 0:
            return False
        acked = self.acks.get(run.item.id)
        if acked is not None:
            return acked < int(run.audio_ms)
        return run.played_estimate_ms(now) < int(run.audio_ms)
