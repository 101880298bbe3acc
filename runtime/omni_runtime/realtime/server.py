"""Wiring of the realtime endpoints: one object per worker, one APIRouter for the sockets.

`RealtimeServer` holds what the endpoints share on a worker: the engine, the limits, the metrics,
the live realtime/video sessions, the streaming-input sessions, the VAD factory and the speech
capacity (`realtime.capacity`, shared with the chat API). The worker app
includes ``server.router()`` (the /v1/realtime, /v1/duplex and /v1/video/chat/stream sockets); streaming input's
HTTP routes, and its Mode A on ``/v1/chat/completions``, are the api layer's
(`omni_runtime.api.streaming_input`), serving ``server.streaming``. Torch stays out: the silero VAD
module is imported the first time a session turns server VAD on.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, WebSocket
from prometheus_client import CollectorRegistry

from omni_runtime.contract.engine import Engine
from omni_runtime.realtime.capacity import SpeechCapacity, SpeechCapacityCollector
from omni_runtime.realtime.metrics import RealtimeMetrics
from omni_runtime.realtime.session.endpoint import RealtimeSessions, refuse_speech, serve_realtime
from omni_runtime.realtime.session.turn_detection import SpeechScorer
from omni_runtime.realtime.settings import RealtimeSettings
from omni_runtime.realtime.streaming_input.manager import StreamingInputManager
from omni_runtime.realtime.video.endpoint import VideoSession, serve_video


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
        # Speech streams of the whole worker: chat completions with audio take slots here too.
        self.speech = SpeechCapacity(limit=self.settings.max_speech_streams)
        self.metrics.registry.register(SpeechCapacityCollector(self.speech))
        self.sessions = RealtimeSessions(settings=self.settings, metrics=self.metrics)
        self.videos: set[VideoSession] = set()
        self.streaming = StreamingInputManager(engine=engine, settings=self.settings, metrics=self.metrics)
        self.scorer_factory = scorer_factory

    def router(self) -> APIRouter:
        router = APIRouter()

        async def session_socket(websocket: WebSocket, *, native_duplex: bool) -> None:
            await serve_realtime(
                websocket,
                engine=self.engine,
                settings=self.settings,
                metrics=self.metrics,
                sessions=self.sessions,
                scorer_factory=self.scorer_factory,
                speech=self.speech,
                native_duplex=native_duplex,
            )

        @router.websocket("/v1/realtime")
        async def realtime(websocket: WebSocket) -> None:
            await session_socket(websocket, native_duplex=False)

        @router.websocket("/v1/duplex")
        async def duplex(websocket: WebSocket) -> None:
            await session_socket(websocket, native_duplex=True)

        @router.websocket("/v1/video/chat/stream")
        async def video(websocket: WebSocket) -> None:
            slot = None
            if self.engine.ready and self.engine.supports_audio_output:  # the session may speak
                slot = self.speech.acquire("video")
                if slot is None:
                    offered = websocket.scope.get("subprotocols") or []
                    await refuse_speech(
                        websocket, self.speech, metrics=self.metrics, kind="video", subprotocols=offered
                    )
                    return
            try:
                await serve_video(
                    websocket,
                    engine=self.engine,
                    settings=self.settings,
                    metrics=self.metrics,
                    live=self.videos,
                )
            finally:
                if slot is not None:
                    slot.release()

        return router

    async def warmup(self) -> None:
        """Load the VAD model now (off the event loop), so the first session does not wait for it."""
        if self.scorer_factory is silero_scorer_factory:
            from omni_runtime.realtime.session.vad import preload

            await preload()

    async def aclose(self) -> None:
        """Release every session (worker shutdown)."""
        await self.sessions.close_all()
        for session in list(self.videos):
            await session.close()
        await self.streaming.close()
