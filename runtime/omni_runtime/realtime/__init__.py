"""Realtime endpoints of a worker: /v1/realtime (OpenAI Realtime, full duplex), streaming video, streaming input.

Wiring (in the worker's app factory)::

    from omni_runtime.realtime import RealtimeServer, RealtimeSettings, StreamingInputChatMiddleware

    realtime = RealtimeServer(engine=engine, settings=RealtimeSettings(worker_id=worker_id), registry=registry)
    app.include_router(realtime.router())
    app.add_middleware(StreamingInputChatMiddleware, server=realtime)   # Mode A on /v1/chat/completions
    # in the lifespan: await realtime.warmup() at start-up (loads the VAD), await realtime.aclose() at shutdown

Layout: one subpackage per protocol (`session/` the /v1/realtime socket with duplex, `video/` the
streaming video socket, `streaming_input/` streaming-input sessions); what they share sits here
(`audio`, `errors`, `metrics`, `settings`, `outbox`, `protocol`), with `server` wiring them up.
Only `realtime.session.vad` imports torch, and only when a session turns server VAD on.
"""

from omni_runtime.realtime.server import (
    RealtimeServer,
    StreamingInputChatMiddleware,
    realtime_router,
    silero_scorer_factory,
)
from omni_runtime.realtime.settings import RealtimeSettings

__all__ = [
    "RealtimeServer",
    "RealtimeSettings",
    "StreamingInputChatMiddleware",
    "realtime_router",
    "silero_scorer_factory",
]
