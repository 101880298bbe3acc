"""Wiring of the realtime endpoints: one object per worker, one APIRouter, one middleware.

`RealtimeServer` holds what the endpoints share on a worker: the engine, the limits, the metrics,
the live realtime/video sessions, the streaming-input sessions and the VAD factory. The worker app
includes ``server.router()`` and, for Mode A streaming input on ``/v1/chat/completions``, adds
`StreamingInputChatMiddleware` (it takes only requests with ``X-Streaming-Input: true``, before the
chat route parses the body as JSON). Torch stays out: the silero VAD module is imported the first
time a session turns server VAD on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import Response
from prometheus_client import CollectorRegistry

from omni_runtime.contract.engine import Engine
from omni_runtime.realtime.metrics import RealtimeMetrics
from omni_runtime.realtime.session.endpoint import RealtimeSessions, serve_realtime
from omni_runtime.realtime.session.turn_detection import SpeechScorer
from omni_runtime.realtime.settings import RealtimeSettings
from omni_runtime.realtime.streaming_input.http import (
    StreamingInputManager,
    streaming_input_chat_completion,
    streaming_input_router,
)
from omni_runtime.realtime.video.endpoint import VideoSession, serve_video

STREAMING_INPUT_HEADER = "x-streaming-input"
CHAT_COMPLETIONS = "/v1/chat/completions"


def silero_scorer_factory() -> SpeechScorer:
    from omni_runtime.realtime.session.vad import silero_scorer  # imports torch: only when VAD is used

    return silero_scorer()


class RealtimeServer:
    def __init__(
        self,
        *,
        engine: Engine,
        settings: RealtimeSettings | None = None,
        registry: CollectorRegistry | None = None,
        scorer_factory: Callable[[], SpeechScorer] = silero_scorer_factory,
    ) -> None:
        self.engine = engine
        self.settings = settings or RealtimeSettings()
        self.metrics = RealtimeMetrics(settings=self.settings, registry=registry)
        self.sessions = RealtimeSessions(settings=self.settings, metrics=self.metrics)
        self.videos: set[VideoSession] = set()
        self.streaming = StreamingInputManager(engine=engine, settings=self.settings, metrics=self.metrics)
        self.scorer_factory = scorer_factory

    def router(self) -> APIRouter:
        router = APIRouter()

        @router.websocket("/v1/realtime")
        async def realtime(websocket: WebSocket) -> None:
            await serve_realtime(
                websocket,
                engine=self.engine,
                settings=self.settings,
                metrics=self.metrics,
                sessions=self.sessions,
                scorer_factory=self.scorer_factory,
            )

        @router.websocket("/v1/video/chat/stream")
        async def video(websocket: WebSocket) -> None:
            await serve_video(
                websocket, engine=self.engine, settings=self.settings, metrics=self.metrics, live=self.videos
            )

        router.include_router(streaming_input_router(manager=self.streaming, metrics=self.metrics))
        return router

    async def warmup(self) -> None:
        """Load the VAD model now (off the event loop), so the first session does not wait for it."""
        if self.scorer_factory is silero_scorer_factory:
            from omni_runtime.realtime.session.vad import preload

            await preload()

    async def chat_completion(self, request: Request) -> Response:
        """Mode A streaming input: the NDJSON body of a ``/v1/chat/completions`` request."""
        return await streaming_input_chat_completion(request, manager=self.streaming)

    async def aclose(self) -> None:
        """Release every session (worker shutdown)."""
        await self.sessions.close_all()
        for session in list(self.videos):
            await session.close()
        await self.streaming.close()


class StreamingInputChatMiddleware:
    """Sends ``POST /v1/chat/completions`` with ``X-Streaming-Input: true`` to Mode A; the rest passes."""

    def __init__(self, app: Any, *, server: RealtimeServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"].rstrip("/") == CHAT_COMPLETIONS
            and _header(scope, STREAMING_INPUT_HEADER).lower() == "true"
        ):
            response = await self.server.chat_completion(Request(scope, receive))
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _header(scope: dict[str, Any], name: str) -> str:
    wanted = name.encode()
    for key, value in scope.get("headers", []):
        if key.lower() == wanted:
            return str(value.decode("latin-1"))
    return ""


def realtime_router(
    *, engine: Engine, settings: RealtimeSettings | None = None, registry: CollectorRegistry | None = None
) -> APIRouter:
    """The realtime endpoints as one router (use `RealtimeServer` to also get Mode A and shutdown)."""
    return RealtimeServer(engine=engine, settings=settings, registry=registry).router()
