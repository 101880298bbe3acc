"""Engine lifecycle under the app: start and warm up in the background, stop on shutdown.

Loading runs in the background so /health answers while a large checkpoint loads (a liveness
probe must not kill a loading worker); /ready turns 200 only after one real generation went
through the whole pipeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI

from omni_runtime.api.state import AppState
from omni_runtime.contract.engine import ChatTurn, EngineError, Finished, GenerationRequest, SamplingParams
from omni_runtime.support.gc_pauses import freeze_heap, watch_gc
from omni_runtime.support.loop_lag import watch_loop_lag

log = logging.getLogger(__name__)


async def _warm_up(state: AppState) -> None:
    """One short generation per output path (text, and speech where the worker has a talker)."""
    paths = [False, True] if state.engine.supports_audio_output else [False]
    for want_audio in paths:
        request = GenerationRequest(
            request_id=f"warmup-{'speech' if want_audio else 'text'}",
            turns=(ChatTurn(role="user", text="Hello."),),
            sampling=SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True),
            want_audio=want_audio,
            stage_params={"talker": {"max_tokens": 24}},  # a few codec windows: enough to touch every stage
        )
        events = state.engine.generate(request)
        try:
            async for event in events:
                if isinstance(event, Finished) and event.reason == "error":
                    raise RuntimeError(f"warm-up generation failed: {event.error}")
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()


async def start_engine(state: AppState) -> None:
    began = time.perf_counter()
    try:
        await state.engine.start()
        if state.settings.warmup:
            await _warm_up(state)
        if state.realtime is not None:
            await state.realtime.warmup()  # loads the VAD model before the first session needs it
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # any start failure makes the worker unready and is reported, not hidden
        state.startup_error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, EngineError):  # a setting it refuses: the message names it and the fix
            log.error("the engine failed to start: %s", exc)
        else:
            log.exception("the engine failed to start")
        if state.on_startup_failure is not None:
            state.on_startup_failure(exc)
        return
    if state.settings.gc_freeze:
        freeze_heap("omni serve")  # after warm-up: the lazily built parts of the pipeline are in
    state.warmed_up = True
    log.info("ready: %s loaded and warmed up in %.1f s", state.model_name, time.perf_counter() - began)


@contextlib.asynccontextmanager
async def engine_lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: AppState = app.state.omni
    starter = asyncio.create_task(start_engine(state), name="omni-engine-start")
    lag = asyncio.create_task(watch_loop_lag(state.metrics.loop_lag.observe), name="omni-loop-lag")
    watch_gc()
    try:
        yield
    finally:
        for task in (starter, lag):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if state.realtime is not None:
            await state.realtime.aclose()
        await state.engine.stop()
