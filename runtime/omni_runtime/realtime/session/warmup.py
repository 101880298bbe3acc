"""A realtime session's history prefilled while the user speaks (the start of incremental input).

The engine keeps each session's thinker KV between turns (conversation KV), but what it kept can
run past the history: a barge-in or ``conversation.item.truncate`` cuts the reply to what the
user heard, an edit changes an earlier item, and a busy worker may have evicted the entry. Then
the next turn would prefill from the first changed token at the end of the user's speech, when
the answer is due. So once per turn, on the user's first audio, the session asks the engine to
prefill the history as it stands (``Engine.warm_session``), and the response then prefills only
the new audio. A response that starts while its warm-up is still under way stops it rather than
wait for it (``settle``): a warm-up already prefilling keeps what it computed (a cancelled row
keeps its KV), one still queued or preprocessing is dropped and the response does that work
itself, so a warm-up never delays an answer. It is exact by the same rule as every turn, so it
never changes one either.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from omni_runtime.contract.engine import Engine, EngineError, GenerationRequest, SamplingParams
from omni_runtime.realtime.protocol import new_id
from omni_runtime.realtime.session.config import SessionConfig
from omni_runtime.realtime.session.conversation import Conversation
from omni_runtime.realtime.settings import RealtimeSettings, default_max_tokens

log = logging.getLogger("omni.realtime")


class WarmedSession(Protocol):
    """What the warm-up reads of its session (session.RealtimeSession)."""

    id: str
    engine: Engine
    settings: RealtimeSettings
    config: SessionConfig
    conversation: Conversation
    response: Any  # the response in progress, or None


class PrefixWarmer:
    def __init__(self, session: WarmedSession) -> None:
        self.session = session
        self.armed = True  # one warm-up per turn: re-armed when a response ends or history changes
        self.started = 0
        self._task: asyncio.Task[None] | None = None

    def rearm(self) -> None:
        self.armed = True

    def on_user_audio(self) -> None:
        """The user is speaking: warm the history now, unless done this turn or a response runs."""
        session = self.session
        if not self.armed or session.response is not None or self.running:
            return
        self.armed = False
        config = session.config
        max_tokens = config.max_output_tokens or default_max_tokens(
            session.settings, max_model_len=session.engine.max_model_len
        )
        turns = session.conversation.turns(
            instructions=config.instructions,
            token_budget=max(256, session.engine.max_model_len - max_tokens),
            window="response",  # the window the next response's prompt will use
        )
        if not turns:
            return
        request = GenerationRequest(
            request_id=new_id("warm"),
            turns=turns,
            sampling=SamplingParams(max_tokens=1, temperature=0.0),
            session_key=session.id,
        )
        self.started += 1
        self._task = asyncio.create_task(self._run(request), name=f"warm-{session.id}")

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self, request: GenerationRequest) -> None:
        try:
            await self.session.engine.warm_session(request)
        except EngineError as exc:  # the turn itself reports what is wrong with its prompt
            log.info("history warm-up of session %s skipped: %s", self.session.id, exc)

    async def settle(self) -> None:
        """Stop a warm-up under way and wait until it has let go of the session's entry (a
        response calls this before its request, so the two never race for it)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task])

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
