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

With ``RealtimeSettings.warm_spoken_audio`` (on by default; ``OMNI_WARM_SPOKEN_AUDIO=0`` turns it
off) the speech itself follows: each time the session's early encoding has sent another whole
chunk of the turn being spoken to the audio encoder, the warm-up after the history prefills the
history plus that audio as the user's turn so far, so at the end of speech only the audio after
the last whole chunk, and the turn's closing tokens, are left to prefill. The prefix rule keeps it
exact: the kept audio positions are reused only where the final turn's audio embedding equals the
warmed one bit for bit (the encoder cache gives whole chunks the same features), and the tokens
after the partial audio (its end marker, the generation prompt) differ from the final prompt's,
so the reuse stops there.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import numpy as np

from omni_runtime.contract.engine import ChatTurn, Engine, EngineError, GenerationRequest, SamplingParams
from omni_runtime.realtime.protocol import new_id
from omni_runtime.realtime.session.config import SessionConfig
from omni_runtime.realtime.session.conversation import Conversation, Item, Part
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
        self.spoken = 0  # warm-ups that carried the turn's speech so far (warm_spoken_audio)
        self._task: asyncio.Task[None] | None = None
        self._speech: np.ndarray | None = None  # the turn's audio encoded so far, not yet warmed

    def rearm(self) -> None:
        self.armed = True

    def forget_speech(self) -> None:
        """The turn was committed or its audio cleared: its partial speech is not warmed any more."""
        self._speech = None

    def on_user_audio(self) -> None:
        """The user is speaking: warm the history now, unless done this turn or a response runs."""
        if not self.armed or self.session.response is not None or self.running:
            return
        self.armed = False
        self._start(())

    def on_speech_encoded(self, audio: np.ndarray) -> None:
        """The turn being spoken, from its start to the end of its last whole encoder chunk, went
        to the audio encoder: warm it after the history (now, or when the warm-up under way ends)."""
        if not self.session.settings.warm_spoken_audio:
            return
        self._speech = audio
        self._next_speech()

    def _next_speech(self) -> None:
        if self._speech is None or self.session.response is not None or self.running:
            return
        item = Item(id="spoken", role="user", content=[Part(type="input_audio", audio=self._speech)])
        self._speech = None
        turn = item.chat_turn()
        self.armed = False  # this warm-up covers the history too
        if turn is not None and self._start((turn,)):
            self.spoken += 1

    def _start(self, spoken: tuple[ChatTurn, ...]) -> bool:
        session = self.session
        config = session.config
        max_tokens = config.max_output_tokens or default_max_tokens(
            session.settings, max_model_len=session.engine.max_model_len
        )
        turns = session.conversation.turns(
            instructions=config.instructions,
            token_budget=max(256, session.engine.max_model_len - max_tokens),
            window="response",  # the window the next response's prompt will use
        )
        if not turns and not spoken:
            return False
        request = GenerationRequest(
            request_id=new_id("warm"),
            turns=turns + spoken,
            sampling=SamplingParams(max_tokens=1, temperature=0.0),
            session_key=session.id,
        )
        self.started += 1
        self._task = asyncio.create_task(self._run(request), name=f"warm-{session.id}")
        return True

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _run(self, request: GenerationRequest) -> None:
        try:
            await self.session.engine.warm_session(request)
        except EngineError as exc:  # the turn itself reports what is wrong with its prompt
            log.info("history warm-up of session %s skipped: %s", self.session.id, exc)
            self._speech = None
            return
        asyncio.get_running_loop().call_soon(self._next_speech)  # once this task is done

    async def settle(self) -> None:
        """Stop a warm-up under way and wait until it has let go of the session's entry (a
        response calls this before its request, so the two never race for it)."""
        self._speech = None
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task])

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
