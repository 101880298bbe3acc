"""Model-driven full duplex: the unit clock, the model's listen/speak probe, and the pending turn.

A duplex session with ``auto_response`` (or ``full_duplex``) does not end turns on VAD silence.
Instead `DuplexDriver` counts appended audio in units (``unit_ms``, ~1 s) and, at the end of each,
applies `duplex_policy.decide_unit`; where the policy leaves the choice to the model it asks the
served thinker (`probe_model`): one greedy token after the conversation plus the user's pending
audio. ``listen`` is announced as ``response.listen``; ``speak`` commits the pending audio as a
user item and starts a response, announced by ``response.speak`` (``response.created`` follows).
Per-append hints of vLLM-Omni's duplex lane are honoured: ``force_listen`` (this unit listens) and
``force_barge_in`` (the assistant stops now, whatever the overlap policy says).

The driver owns no socket and no response: it calls back into its `RealtimeSession`.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from omni_runtime.contract.engine import (
    ChatTurn,
    Engine,
    EngineError,
    Finished,
    GenerationRequest,
    MediaInput,
    SamplingParams,
    TextDelta,
)
from omni_runtime.realtime.audio import MODEL_RATE
from omni_runtime.realtime.errors import ProtocolError, invalid
from omni_runtime.realtime.metrics import RealtimeMetrics
from omni_runtime.realtime.outbox import Outbox
from omni_runtime.realtime.protocol import close_quietly, new_id
from omni_runtime.realtime.session.config import EAGERNESS_UNIT_MS, SessionConfig
from omni_runtime.realtime.session.conversation import Conversation
from omni_runtime.realtime.session.duplex_policy import Decision, UnitState, decide_unit, model_choice
from omni_runtime.realtime.session.input_audio import InputAudio
from omni_runtime.realtime.session.overlap import Overlap
from omni_runtime.realtime.session.response import ResponseRun
from omni_runtime.realtime.session.turn_detection import Listener
from omni_runtime.realtime.settings import RealtimeSettings

log = logging.getLogger("omni.realtime")
PROBE_HINT = (
    "You are in a live spoken conversation and hear the user as they talk. If the user has not "
    "finished, or nothing calls for a reply, end your turn without a word."
)


class RealtimeSession(Protocol):
    """What the driver uses of its session (`session.RealtimeSession`)."""

    id: str
    engine: Engine
    settings: RealtimeSettings
    metrics: RealtimeMetrics
    config: SessionConfig
    conversation: Conversation
    input: InputAudio
    outbox: Outbox
    overlap: Overlap
    response: ResponseRun | None

    @property
    def listener(self) -> Listener | None: ...

    def commit_audio(self, samples: Any, item_id: str) -> None: ...

    def start_response(self, body: dict[str, Any], *, turn_ended_at: float | None) -> ResponseRun: ...

    def error(self, exc: ProtocolError, *, event_id: str | None = None) -> None: ...


def append_hints(event: dict[str, Any]) -> tuple[bool, bool]:
    """``force_listen`` and ``force_barge_in`` of an ``input_audio_buffer.append`` (both optional)."""
    hints = []
    for name in ("force_listen", "force_barge_in"):
        value = event.get(name, False)
        if not isinstance(value, bool):
            raise invalid(name, f"expected true or false, got {value!r}")
        hints.append(value)
    return hints[0], hints[1]


def commit_create_response(event: dict[str, Any]) -> bool | None:
    """A duplex commit's ``create_response`` (or ``response_create``): True, False, or None (the model decides)."""
    name = "create_response" if "create_response" in event else "response_create"
    value = event.get(name)
    if value is not None and not isinstance(value, bool):
        raise invalid(name, f"expected true, false or null, got {value!r}")
    return value


def probe_session_key(session_id: str) -> str:
    """The conversation-KV key of a session's duplex probes."""
    return f"{session_id}/probe"


async def probe_model(session: RealtimeSession, audio: Any) -> Decision:
    """Ask the thinker whether it takes the turn now: its greedy first token decides."""
    config = session.config
    instructions = f"{config.instructions}\n\n{PROBE_HINT}".strip()
    budget = max(256, session.engine.max_model_len - 8)
    turns = session.conversation.turns(instructions=instructions, token_budget=budget, window="probe")
    if audio is not None and audio.size:
        turns = (
            *turns,
            ChatTurn(role="user", media=(MediaInput(kind="audio", data=audio, sample_rate=MODEL_RATE),)),
        )
    request = GenerationRequest(
        request_id=new_id("probe"),
        turns=turns,
        sampling=SamplingParams(max_tokens=1, temperature=0.0),
        want_audio=False,
        # Probes keep their own conversation KV: their system prompt (the probe hint) differs
        # from the responses', so sharing one entry would make each undo the other's.
        session_key=probe_session_key(session.id),
    )
    text, reason = "", "error"
    stream = session.engine.generate(request)
    try:
        async for event in stream:
            if isinstance(event, TextDelta):
                text += event.text
            elif isinstance(event, Finished):
                reason = event.reason
    except EngineError as exc:
        log.warning("duplex probe of session %s failed: %s", session.id, exc)
    finally:
        await close_quietly(stream)
    session.metrics.duplex_probes.labels(reason=reason).inc()
    if reason not in ("stop", "length"):
        return Decision("listen", "model_unavailable")
    return model_choice(text=text, finish_reason=reason)


class DuplexDriver:
    def __init__(self, session: RealtimeSession) -> None:
        self.session = session
        self.unit_index = 0  # units decided so far
        self.unit_samples = 0  # 16 kHz samples appended in the current unit
        self.force_listen = False  # the client marked the current unit
        self.new_input = False  # speech (or audio, without VAD) since the last response began
        self.pending_start: int | None = None  # where the user's pending turn begins (16 kHz index)
        self.listens = 0
        self.speaks = 0

    @property
    def active(self) -> bool:
        config = self.session.config
        vad = config.turn_detection
        return config.duplex.model_driven or (vad is not None and vad.semantic)

    def unit_ms(self) -> int:
        """The decision clock: the session's ``unit_ms``, or semantic_vad's eagerness."""
        config = self.session.config
        vad = config.turn_detection
        if vad is not None and vad.semantic and not config.duplex.model_driven:
            return EAGERNESS_UNIT_MS[vad.eagerness]
        return config.duplex.unit_ms

    # --- input ------------------------------------------------------------------------------

    async def on_append(self, hints: tuple[bool, bool], samples: int) -> None:
        """After an append was stored and heard by VAD: its hints (`append_hints`), then the unit clock."""
        force_listen, force_barge_in = hints
        session = self.session
        if force_barge_in and session.overlap.assistant_talking():
            await session.overlap.barge_in(reason="force_barge_in")
        if not self.active:
            return
        self.force_listen = self.force_listen or force_listen
        if session.config.turn_detection is None and samples:
            self.new_input = True
            if self.pending_start is None:
                self.pending_start = session.input.total - samples
        self.unit_samples += samples
        unit = self.unit_ms() * MODEL_RATE // 1000
        while self.unit_samples >= unit:
            self.unit_samples -= unit
            await self._unit_done()

    def on_speech(self, audio_start_ms: int, padding_ms: int) -> None:
        """Server VAD heard the user start: the pending turn begins there (with padding)."""
        if not self.active:
            return
        self.new_input = True
        if self.pending_start is None:
            self.pending_start = self.session.input.position(max(0, audio_start_ms - padding_ms))

    def on_backchannel(self, audio_start_ms: int, padding_ms: int) -> None:
        """An overlap judged a backchannel: its audio is no turn of its own."""
        start = self.session.input.position(max(0, audio_start_ms - padding_ms))
        if self.pending_start is not None and self.pending_start >= start:
            self.pending_start = None
            self.new_input = False

    def holds_turn(self) -> bool:
        return self.active and self.pending_start is not None

    async def after_commit(self, create: bool | None) -> None:
        """A client commit in a model-driven session: a response only if asked for or the model speaks."""
        if not self.active:
            return
        self.pending_start = None
        self.new_input = False
        session = self.session
        if create is False or session.response is not None:
            return
        decision = Decision("speak", "create_response") if create else await probe_model(session, None)
        if session.response is not None:
            return
        if decision.action == "listen":
            self._listen(decision)
        else:
            self._speak(decision)

    # --- decisions --------------------------------------------------------------------------

    async def _unit_done(self) -> None:
        session = self.session
        listener = session.listener
        state = UnitState(
            index=self.unit_index,
            force_listen_count=session.config.duplex.force_listen_count,
            client_force_listen=self.force_listen,
            user_speaking=listener is not None and listener.in_speech,
            new_input=self.new_input,
            response_active=session.response is not None,
        )
        self.unit_index += 1
        self.force_listen = False
        decision = decide_unit(state)
        if decision.ask_model:
            decision = await probe_model(session, self._pending_audio())
            if session.response is not None:
                return  # a response started while the model was asked (response.create)
        if decision.action == "listen":
            self._listen(decision, state.index)
        elif decision.action == "speak":
            self._speak(decision, state.index)

    def _pending_audio(self) -> Any:
        audio = self.session.input
        start = audio.start if self.pending_start is None else max(self.pending_start, audio.start)
        return audio.peek(start=start)

    def _listen(self, decision: Decision, unit: int | None = None) -> None:
        session = self.session
        self.listens += 1
        session.metrics.duplex_decisions.labels(action="listen", reason=decision.reason).inc()
        session.outbox.emit(
            "response.listen",
            epoch=session.outbox.epoch,
            session_id=session.id,
            response={
                "object": "realtime.response",
                "status": "listening",
                "metadata": {
                    "model_listen": decision.model_listen,
                    "reason": decision.reason,
                    "unit_index": unit,
                    "force_listen": decision.reason in ("force_listen_count", "client_force_listen"),
                },
            },
        )
        audio = session.input
        keep = audio.position(session.settings.max_input_buffer_seconds * 500)  # half the buffer
        if audio.size > keep:
            audio.drop_before(audio.total - keep)

    def _speak(self, decision: Decision, unit: int | None = None) -> None:
        session = self.session
        samples = self._pending_audio()
        self.pending_start = None
        self.new_input = False
        session.input.drop_before(session.input.total)
        if session.input.ms(samples.size) >= 100:
            session.commit_audio(samples, new_id("item"))
        try:
            run = session.start_response({}, turn_ended_at=time.monotonic())
        except ProtocolError as exc:
            session.error(exc)
            return
        self.speaks += 1
        session.metrics.duplex_decisions.labels(action="speak", reason=decision.reason).inc()
        session.outbox.emit(
            "response.speak",
            epoch=run.epoch,
            response_id=run.id,
            item_id=run.item.id,
            metadata={"model_speak": True, "reason": decision.reason, "unit_index": unit},
        )
