"""The /v1/realtime WebSocket: one socket, one `RealtimeSession`, and resumable duplex sessions.

The socket runs two loops: the receiver hands each text message to the session in order (and
enforces the idle and total-length limits), the sender drains the session's outbox. A duplex
session whose socket drops without a normal close is kept for ``resume_grace_s``: a client that
reconnects with ``?duplex=1&session_id=<resume token>&last_event_id=<last seen>`` gets the events
it missed (stale audio excluded) and the session carries on. The resume token is the session id,
which names this worker, so the router sends the reconnect here (``session_id`` query parameter).
``/v1/duplex`` is the same session, always duplex, with the duplex bridges' event names.

Two dialects share the socket (`omni_runtime.realtime.transcription.dialect`): the OpenAI Realtime
API (`RealtimeSession`) and vLLM-Omni's transcription flow (`TranscriptionSession`). ``?protocol=``
names one; without it the socket opens as OpenAI with a ``session.created`` that also carries vLLM's
top-level ``id`` and ``created``, and the first client event decides: a vLLM one hands the session
(its id, outbox and slot) over to a `TranscriptionSession` before that event is handled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.websockets import WebSocket, WebSocketDisconnect

from omni_runtime.contract.engine import Engine
from omni_runtime.realtime.capacity import SpeechCapacity, SpeechSlot, refusal_headers
from omni_runtime.realtime.errors import (
    NOT_READY,
    SERVER_ERROR,
    SESSION_EXPIRED,
    SESSION_LIMIT,
    SESSION_NOT_FOUND,
    ProtocolError,
)
from omni_runtime.realtime.metrics import RealtimeMetrics
from omni_runtime.realtime.session.duplex_config import event_dialect
from omni_runtime.realtime.session.session import RealtimeSession
from omni_runtime.realtime.session.turn_detection import SpeechScorer
from omni_runtime.realtime.settings import RealtimeSettings
from omni_runtime.realtime.transcription.dialect import Dialect, pick_dialect, requested_dialect
from omni_runtime.realtime.transcription.session import TranscriptionSession

log = logging.getLogger("omni.realtime")
NORMAL_CLOSE = 1000
TRY_AGAIN_LATER = 1013
POLICY = 1008
LiveSession = RealtimeSession | TranscriptionSession


@dataclass
class _Entry:
    session: LiveSession
    kick: asyncio.Event = field(default_factory=asyncio.Event)  # set: a newer socket took the session over
    expiry: asyncio.Task[None] | None = None  # grace timer while detached


class RealtimeSessions:
    """This worker's realtime sessions: attached to a socket, or detached and waiting for a resume."""

    def __init__(self, *, settings: RealtimeSettings, metrics: RealtimeMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self._entries: dict[str, _Entry] = {}
        self._speech_slots: dict[str, SpeechSlot] = {}  # held from open to close (realtime.capacity)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, session_id: str) -> LiveSession | None:
        entry = self._entries.get(session_id)
        return entry.session if entry else None

    def add(self, session: LiveSession, *, speech_slot: SpeechSlot | None = None) -> _Entry:
        entry = _Entry(session=session)
        self._entries[session.id] = entry
        if speech_slot is not None:
            self._speech_slots[session.id] = speech_slot
        self.metrics.sessions.labels(kind="realtime").set(len(self._entries))
        self.metrics.sessions_started.labels(kind="realtime").inc()
        return entry

    def claim(self, session_id: str) -> _Entry | None:
        """Take a session over for a reconnecting socket (kicking an older socket still holding it)."""
        old = self._entries.get(session_id)
        if old is None or not isinstance(old.session, RealtimeSession) or not old.session.duplex:
            return None
        if old.expiry is not None:
            old.expiry.cancel()
        old.kick.set()
        entry = _Entry(session=old.session)
        self._entries[session_id] = entry
        self.metrics.resumes.inc()
        return entry

    def detach(self, entry: _Entry) -> None:
        """Keep the session for the grace period, then close it if nobody came back. An entry a
        reconnecting socket already claimed is left alone: its outbox is the new socket's now."""
        if self._entries.get(entry.session.id) is not entry:
            return
        entry.session.outbox.detach()
        entry.expiry = asyncio.create_task(self._expire(entry))

    async def _expire(self, entry: _Entry) -> None:
        await asyncio.sleep(self.settings.resume_grace_s)
        await self.remove(entry)

    async def remove(self, entry: _Entry) -> None:
        if self._entries.get(entry.session.id) is entry:
            del self._entries[entry.session.id]
            if (slot := self._speech_slots.pop(entry.session.id, None)) is not None:
                slot.release()
            self.metrics.sessions.labels(kind="realtime").set(len(self._entries))
            await entry.session.close()

    async def close_all(self) -> None:
        for entry in list(self._entries.values()):
            if entry.expiry is not None:
                entry.expiry.cancel()
            await self.remove(entry)


async def _refuse(
    ws: WebSocket,
    error: ProtocolError,
    *,
    code: int,
    metrics: RealtimeMetrics,
    dialect: Dialect | None = None,
    kind: str = "realtime",
) -> None:
    """Refuse a socket with an ``error`` event; the dialect is unknown yet unless ``protocol`` named it."""
    metrics.errors.labels(kind=kind, code=error.code).inc()
    event: dict[str, object]
    if dialect == "vllm":
        event = {"type": "error", "error": error.message, "code": error.code, "param": error.param}
    else:  # OpenAI's shape, with the code also on top where a vLLM client looks for it
        event = {"type": "error", "event_id": "event_0", "error": error.error_body(), "code": error.code}
    await ws.send_text(json.dumps(event))
    await ws.close(code=code, reason=error.message[:120])


async def refuse_speech(
    ws: WebSocket, speech: SpeechCapacity, *, metrics: RealtimeMetrics, kind: str, subprotocols: list[str]
) -> None:
    """Accept with the capacity header, send the ``error`` event, close with 1013."""
    headers = [(k.encode(), v.encode()) for k, v in refusal_headers().items()]
    await ws.accept(subprotocol="realtime" if "realtime" in subprotocols else None, headers=headers)
    await _refuse(ws, speech.error(), code=TRY_AGAIN_LATER, metrics=metrics, kind=kind)


async def serve_realtime(
    ws: WebSocket,
    *,
    engine: Engine,
    settings: RealtimeSettings,
    metrics: RealtimeMetrics,
    sessions: RealtimeSessions,
    scorer_factory: Callable[[], SpeechScorer],
    speech: SpeechCapacity | None = None,
    native_duplex: bool = False,
) -> None:
    params = ws.query_params
    asked = params.get("duplex")
    duplex = native_duplex or (
        settings.duplex_by_default if asked is None else asked.lower() in ("1", "true", "yes", "on")
    )
    offered = ws.scope.get("subprotocols") or []
    resume_id = params.get("session_id")
    # A new session on a worker that speaks takes a speech slot before the handshake, so that a
    # refusal's accept carries the capacity header the router retries on (realtime.capacity).
    slot = None
    if speech is not None and not resume_id and engine.ready and engine.supports_audio_output:
        slot = speech.acquire("realtime")
        if slot is None:
            await refuse_speech(ws, speech, metrics=metrics, kind="realtime", subprotocols=offered)
            return
    try:
        await ws.accept(subprotocol="realtime" if "realtime" in offered else None)
    except BaseException:
        if slot is not None:
            slot.release()
        raise
    try:  # the socket's choices, refused as an error event now that it is accepted
        dialect = requested_dialect(params.get("protocol"), duplex=duplex or bool(resume_id))
        names = event_dialect(
            native=native_duplex,
            beta_header="realtime=v1" in ws.headers.get("openai-beta", ""),
            query=params.get("event_names"),
        )
    except ProtocolError as refusal:
        if slot is not None:
            slot.release()
        await _refuse(ws, refusal, code=POLICY, metrics=metrics)
        return
    if resume_id:
        entry = sessions.claim(resume_id)
        if entry is None or not isinstance(entry.session, RealtimeSession):
            error = ProtocolError(
                f"no resumable session {resume_id!r} on this worker (it ended, its grace period passed, "
                "or it was not a duplex session); open a new session",
                code=SESSION_NOT_FOUND,
                param="session_id",
            )
            await _refuse(ws, error, code=POLICY, metrics=metrics)
            return
        session = entry.session
        replayed, complete = session.outbox.attach(last_event_id=params.get("last_event_id"))
        session.outbox.emit(
            "session.resumed",
            session=session.config.to_json(session_id=session.id, beta=session.outbox.beta, duplex=True),
            replayed=replayed,
            replay_complete=complete,
        )
    else:
        if not engine.ready:
            error = ProtocolError(
                "the worker is still loading its model; retry shortly", code=NOT_READY, status=503
            )
            await _refuse(ws, error, code=TRY_AGAIN_LATER, metrics=metrics, dialect=dialect)
            return
        if len(sessions) >= settings.max_realtime_sessions:
            if slot is not None:
                slot.release()
            metrics.sessions_refused.labels(kind="realtime").inc()
            error = ProtocolError(
                f"this worker already serves {settings.max_realtime_sessions} realtime sessions; retry later",
                code=SESSION_LIMIT,
                status=429,
            )
            await _refuse(ws, error, code=TRY_AGAIN_LATER, metrics=metrics, dialect=dialect)
            return
        if dialect == "vllm":
            entry = sessions.add(
                TranscriptionSession(engine=engine, settings=settings, metrics=metrics), speech_slot=slot
            )
            await entry.session.open()
        else:
            realtime = RealtimeSession(
                engine=engine,
                settings=settings,
                metrics=metrics,
                duplex=duplex,
                beta=names == "beta",
                duplex_names=names == "duplex",
                scorer_factory=scorer_factory,
            )
            entry = sessions.add(realtime, speech_slot=slot)
            # Undecided: the fields vLLM's session.created has too, since its clients wait for them.
            await realtime.open(**({} if dialect else {"id": realtime.id, "created": int(time.time())}))

    def first_event(text: str) -> None:
        """Auto-detection: a vLLM client's first event hands the (untouched) session over."""
        old = entry.session
        if (
            isinstance(old, RealtimeSession)
            and pick_dialect(text, max_bytes=settings.max_event_bytes) == "vllm"
        ):
            entry.session = TranscriptionSession(
                engine=engine,
                settings=settings,
                metrics=metrics,
                session_id=old.id,
                outbox=old.outbox,
                created_at=old.created_at,
            )

    sender = asyncio.create_task(_send_loop(ws, entry.session))
    kicked = asyncio.create_task(entry.kick.wait())
    receiver = asyncio.create_task(
        _receive_loop(
            ws, entry, settings, on_first_text=first_event if dialect is None and not resume_id else None
        )
    )
    done, _ = await asyncio.wait({receiver, kicked, sender}, return_when=asyncio.FIRST_COMPLETED)
    # A sender that stops first hit a dead socket: the client dropped, like a receiver error.
    # Kicked wins: a reconnect may claim the session before this socket's drop is noticed, and the
    # session (its outbox too) then belongs to the new socket, whatever the receiver saw.
    ending = "kicked" if entry.kick.is_set() else receiver.result() if receiver in done else "dropped"
    for task in (receiver, kicked):
        task.cancel()
    if ending == "kicked":
        sender.cancel()
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await ws.close(code=NORMAL_CLOSE, reason="resumed on another connection")
        return
    if entry.session.duplex and ending == "dropped":
        sender.cancel()
        sessions.detach(entry)
        return
    await sessions.remove(entry)  # closes the session: its last events drain through the sender
    with contextlib.suppress(asyncio.CancelledError, RuntimeError, WebSocketDisconnect):
        await asyncio.wait_for(sender, timeout=5)
    with contextlib.suppress(RuntimeError, WebSocketDisconnect):
        await ws.close(code=NORMAL_CLOSE)


async def _send_loop(ws: WebSocket, session: LiveSession) -> None:
    try:
        while (text := await session.outbox.next_text()) is not None:
            await ws.send_text(text)
    except (WebSocketDisconnect, RuntimeError):
        return  # the socket is gone; the receiver notices too


async def _receive_loop(
    ws: WebSocket, entry: _Entry, settings: RealtimeSettings, *, on_first_text: Callable[[str], None] | None
) -> str:
    """Feed client messages to the session; returns why it stopped: closed, dropped or expired."""
    deadline = entry.session.created_at + settings.max_session_seconds
    while True:
        session = entry.session
        now = time.monotonic()
        timeout = min(settings.session_idle_timeout_s, deadline - now)
        try:
            message = await asyncio.wait_for(ws.receive(), timeout=max(timeout, 0.001))
        except TimeoutError:
            reason = (
                f"the session reached its length limit of {settings.max_session_seconds:g} s"
                if time.monotonic() >= deadline
                else f"no client event for {settings.session_idle_timeout_s:g} s"
            )
            session.error(ProtocolError(f"{reason}; open a new session", code=SESSION_EXPIRED))
            return "expired"
        except (WebSocketDisconnect, RuntimeError):
            return "dropped"
        if message["type"] == "websocket.disconnect":
            return "closed" if message.get("code", 1000) == NORMAL_CLOSE else "dropped"
        text = message.get("text")
        if text is None:
            session.error(
                ProtocolError(
                    "binary frames are not part of the protocol; send JSON text events", code="invalid_event"
                )
            )
            continue
        if on_first_text is not None:
            on_first_text(text)
            on_first_text = None
            session = entry.session
        try:
            await session.handle_text(text)
        except Exception:
            # A fault of ours in one event must not take the whole conversation down.
            log.exception("realtime session %s failed on an event", session.id)
            session.error(
                ProtocolError(
                    "the worker failed on this event; the details are in its log",
                    code="internal_error",
                    type=SERVER_ERROR,
                    status=500,
                )
            )
