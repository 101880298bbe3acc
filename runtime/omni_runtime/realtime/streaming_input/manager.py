"""The streaming-input sessions of one worker: create within the limits, look up, release when idle.

Session ids name this worker (prefix ``si``), so the router sends every follow-up of a session
here. A session idle for ``session_timeout_s`` is released by a reaper task that runs while any
session lives. Refusals (disabled, too many sessions, unknown id) are `ProtocolError`s carrying
their HTTP status; the api layer renders them.
"""

from __future__ import annotations

import asyncio
import time

from omni_runtime.contract.engine import Engine
from omni_runtime.contract.sessions import make_session_id
from omni_runtime.realtime.errors import DISABLED, SESSION_LIMIT, SESSION_NOT_FOUND, ProtocolError
from omni_runtime.realtime.metrics import RealtimeMetrics
from omni_runtime.realtime.settings import RealtimeSettings
from omni_runtime.realtime.streaming_input.models import StreamingInputParams
from omni_runtime.realtime.streaming_input.session import StreamingInputSession


class StreamingInputManager:
    def __init__(self, *, engine: Engine, settings: RealtimeSettings, metrics: RealtimeMetrics) -> None:
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.sessions: dict[str, StreamingInputSession] = {}
        self._reaper: asyncio.Task[None] | None = None

    def _gauge(self) -> None:
        self.metrics.sessions.labels(kind="streaming_input").set(len(self.sessions))

    def create(self, params: StreamingInputParams) -> StreamingInputSession:
        if not self.settings.streaming_input_enabled:
            raise ProtocolError("streaming input is disabled on this worker", code=DISABLED, status=404)
        if len(self.sessions) >= self.settings.max_streaming_input_sessions:
            self.metrics.sessions_refused.labels(kind="streaming_input").inc()
            raise ProtocolError(
                f"this worker already holds {self.settings.max_streaming_input_sessions} streaming-input sessions; "
                "retry later",
                code=SESSION_LIMIT,
                status=429,
            )
        session = StreamingInputSession(
            session_id=make_session_id(worker_id=self.settings.worker_id, prefix="si"),
            params=params,
            engine=self.engine,
            settings=self.settings,
        )
        self.sessions[session.id] = session
        self.metrics.sessions_started.labels(kind="streaming_input").inc()
        self._gauge()
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap())
        return session

    def get(self, session_id: str) -> StreamingInputSession:
        session = self.sessions.get(session_id)
        if session is None:
            raise ProtocolError(
                f"no streaming-input session {session_id!r} on this worker (it expired after "
                f"{self.settings.session_timeout_s:g} s idle, was deleted, or never existed)",
                code=SESSION_NOT_FOUND,
                param="session_id",
                status=404,
            )
        session.touch()
        return session

    async def remove(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        self._gauge()
        if session is not None:
            await session.cancel()

    async def _reap(self) -> None:
        timeout = self.settings.session_timeout_s
        while self.sessions:
            await asyncio.sleep(min(1.0, max(timeout / 4, 0.01)))
            now = time.monotonic()
            for session_id, session in list(self.sessions.items()):
                if now - session.last_activity > timeout:
                    await self.remove(session_id)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for session_id in list(self.sessions):
            await self.remove(session_id)
