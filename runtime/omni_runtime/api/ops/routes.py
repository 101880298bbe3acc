"""GET /health (alive), GET /ready (loaded and warmed up, with the speech streams in use against the
limit), GET /metrics (Prometheus text)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from omni_runtime.api.state import get_state

router = APIRouter()


@router.get("/health", responses={503: {"description": "The worker failed to start"}})
async def health(raw: Request) -> JSONResponse:
    state = get_state(raw)
    # Alive while loading, so Kubernetes does not restart a worker that is still loading weights;
    # a failed start is not alive.
    if state.startup_error is not None:
        return JSONResponse({"status": "failed", "error": state.startup_error}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/ready", responses={503: {"description": "Still loading or warming up, or failed to start"}})
async def ready(raw: Request) -> JSONResponse:
    state = get_state(raw)
    if state.ready:
        body: dict[str, object] = {"status": "ready", "model": state.model_name}
        speech = state.speech
        if speech is not None and state.engine.supports_audio_output:
            # The router reads it on every probe and ranks a full worker last (realtime.capacity).
            body["speech_streams"] = {"limit": speech.limit, "in_use": speech.in_use}
        return JSONResponse(body)
    status = "failed" if state.startup_error is not None else "starting"
    return JSONResponse({"status": status, "model": state.model_name}, status_code=503)


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text exposition",
            "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
        }
    },
)
async def metrics(raw: Request) -> Response:
    state = get_state(raw)
    await state.engine.refresh_stats()  # the stage processes' counters, when stages run elsewhere
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
