"""Realtime endpoints of a worker: /v1/realtime (OpenAI Realtime, full duplex), streaming video, streaming input.

Wiring (in the worker's app factory, `omni_runtime.api.app.build_app`)::

    from omni_runtime.api.streaming_input.routes import install_streaming_input
    from omni_runtime.realtime import RealtimeServer, RealtimeSettings

    realtime = RealtimeServer(engine=engine, settings=RealtimeSettings(worker_id=worker_id), registry=registry)
    app.include_router(realtime.router())              # the /v1/realtime and video sockets
    install_streaming_input(app, realtime.streaming)   # its HTTP routes, and Mode A on /v1/chat/completions
    # in the lifespan: await realtime.warmup() at start-up (loads the VAD), await realtime.aclose() at shutdown

Layout: one subpackage per protocol (`session/` the /v1/realtime socket with duplex, `video/` the
streaming video socket, `streaming_input/` streaming-input sessions); what they share sits here
(`audio`, `errors`, `metrics`, `settings`, `outbox`, `protocol`), with `server` wiring them up.
HTTP (routes, request parsing, error JSON) is the api layer's: this package imports neither
`omni_runtime.api` nor the engine's pipeline or models. Only `realtime.session.vad` imports torch,
and only when a session turns server VAD on.
"""

from omni_runtime.realtime.server import RealtimeServer, silero_scorer_factory
from omni_runtime.realtime.settings import RealtimeSettings

__all__ = ["RealtimeServer", "RealtimeSettings", "silero_scorer_factory"]
