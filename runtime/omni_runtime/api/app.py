"""The app factory: routes and error handlers on a FastAPI app, wired to one engine.

`build_app` only assembles; the engine's start/warm-up/stop lives in `lifespan.py` and per-app
state in `state.py`, so tests and `omni serve` build the same app. The realtime sockets come from
`omni_runtime.realtime`; streaming input's HTTP routes from `streaming_input/`.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI

from omni_runtime.api.chat.routes import router as chat_router
from omni_runtime.api.errors import document_errors_as_served, install_error_handlers
from omni_runtime.api.lifespan import engine_lifespan
from omni_runtime.api.metrics import RequestCounter
from omni_runtime.api.model_list.routes import router as models_router
from omni_runtime.api.ops.routes import router as ops_router
from omni_runtime.api.settings import ApiSettings
from omni_runtime.api.state import AppState
from omni_runtime.api.streaming_input.routes import install_streaming_input
from omni_runtime.contract.engine import Engine
from omni_runtime.realtime import RealtimeServer, RealtimeSettings


def build_app(
    *,
    engine: Engine,
    settings: ApiSettings,
    on_startup_failure: Callable[[BaseException], None] | None = None,
    realtime_settings: RealtimeSettings | None = None,
) -> FastAPI:
    """A worker's OpenAI-compatible app; the engine starts (and warms up) with the app's lifespan.

    Besides chat completions it serves the session endpoints (/v1/realtime with duplex, streaming
    video, streaming-input sessions, and chunked NDJSON input on /v1/chat/completions).
    """
    app = FastAPI(title="omni worker", version="0.1.0", lifespan=engine_lifespan)
    state = AppState(engine=engine, settings=settings, on_startup_failure=on_startup_failure)
    app.state.omni = state
    install_error_handlers(app)
    document_errors_as_served(app)
    app.include_router(chat_router)
    app.include_router(models_router)
    app.include_router(ops_router)
    state.realtime = RealtimeServer(
        engine=engine,
        settings=realtime_settings or RealtimeSettings(worker_id=settings.worker_id),
        registry=state.metrics.registry,
    )
    app.include_router(state.realtime.router())
    install_streaming_input(app, state.realtime.streaming)
    app.add_middleware(RequestCounter, metrics=state.metrics)
    return app
