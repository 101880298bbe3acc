"""Speech over the assistant and what history keeps of a reply cut short (duplex sessions).

The assistant is "talking" while a response runs and, in duplex sessions, while a finished reply
is still playing at the client (`PlaybackCursor.still_playing`). Speech then is either a
backchannel (the session's overlap policy, decided by `RealtimeSession`) or a barge-in: the
response is cancelled, queued audio of the old epoch is dropped unsent, an ``overlap.decision``
records why, and the assistant item is trimmed to what the client reported playing. A
``response.cancel`` trims the same way; the client's ``playback.ack`` and vLLM-Omni's
``barge_in`` event are handled here too.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from omni_runtime.realtime.errors import NO_ACTIVE_RESPONSE, ProtocolError
from omni_runtime.realtime.metrics import RealtimeMetrics
from omni_runtime.realtime.outbox import Outbox
from omni_runtime.realtime.session.config import SessionConfig
from omni_runtime.realtime.session.conversation import Conversation
from omni_runtime.realtime.session.playback import PlaybackCursor
from omni_runtime.realtime.session.response import ResponseRun


class RealtimeSession(Protocol):
    """What the overlap policy uses of its session (`session.RealtimeSession`)."""

    id: str
    duplex: bool
    metrics: RealtimeMetrics
    config: SessionConfig
    conversation: Conversation
    outbox: Outbox
    playback: PlaybackCursor
    response: ResponseRun | None
    last_response: ResponseRun | None

    def end_overlap(self) -> None: ...

    async def cancel_response(self, reason: str) -> None: ...


class Overlap:
    def __init__(self, session: RealtimeSession) -> None:
        self.session = session

    def assistant_talking(self) -> bool:
        """A response is active, or (duplex) a finished one is still playing at the client."""
        session = self.session
        if session.response is not None:
            return True
        return session.duplex and session.playback.still_playing(session.last_response, time.monotonic())

    async def barge_in(self, *, reason: str) -> None:
        """The user takes the turn: stop the assistant; in duplex, history keeps only what was played."""
        session = self.session
        session.end_overlap()
        run = session.response
        if session.duplex:
            self.decision("barge_in", reason)
        if run is not None:
            session.metrics.barge_ins.inc()
            await session.cancel_response("turn_detected")
        elif session.duplex:
            session.outbox.bump_epoch()  # audio of a finished reply still queued here is not sent
        if session.duplex:
            self.trim_to_played(run or session.last_response)

    def decision(self, action: str, reason: str) -> None:
        session = self.session
        policy = "backchannel_then_barge_in" if session.config.backchannel_max_ms else "barge_in_on_speech"
        session.outbox.emit(
            "overlap.decision", session_id=session.id, policy=policy, action=action, reason=reason
        )

    def trim_to_played(self, run: ResponseRun | None) -> None:
        """Keep in history only the assistant audio (and its share of transcript) the user heard."""
        session = self.session
        if run is None or not run.plan.want_audio or not run.plan.in_conversation:
            return
        item = run.item
        total = item.output_audio_ms()
        played = session.playback.played_ms(run, time.monotonic())
        if played >= total or item not in session.conversation.items:
            return
        item.played_ms = played
        session.outbox.emit(
            "conversation.item.truncated", item_id=item.id, content_index=0, audio_end_ms=played
        )

    # --- client events ----------------------------------------------------------------------

    async def playback_ack(self, event: dict[str, Any]) -> None:
        session = self.session
        current = session.response or session.last_response
        fields = session.playback.ack(event, conversation=session.conversation, current=current)
        session.outbox.emit("playback.acknowledged", **fields)

    async def barge_in_event(self, event: dict[str, Any]) -> None:
        if not self.assistant_talking():
            raise ProtocolError(
                "the assistant is not speaking; nothing to barge in on", code=NO_ACTIVE_RESPONSE
            )
        await self.barge_in(reason="client_barge_in")
