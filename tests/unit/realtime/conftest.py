"""Fixtures for realtime unit tests: a scripted engine and sessions driven by client events."""

from __future__ import annotations

from typing import Any

import pytest
from rt_helpers import Driver, EnergyScorer
from rt_scripted_engine import ScriptedEngine

from omni_runtime.realtime.metrics import RealtimeMetrics
from omni_runtime.realtime.session.session import RealtimeSession
from omni_runtime.realtime.settings import RealtimeSettings


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine()


@pytest.fixture
def settings() -> RealtimeSettings:
    return RealtimeSettings(worker_id="w0", backchannel_max_ms=600)


@pytest.fixture
async def make_driver(engine: ScriptedEngine, settings: RealtimeSettings):
    sessions: list[RealtimeSession] = []

    async def make(
        *, duplex: bool = False, beta: bool = False, vad: bool = False, **overrides: Any
    ) -> Driver:
        session = RealtimeSession(
            engine=engine,
            settings=RealtimeSettings(**{**settings.__dict__, **overrides}) if overrides else settings,
            metrics=RealtimeMetrics(settings=settings),
            duplex=duplex,
            beta=beta,
            scorer_factory=EnergyScorer,
        )
        sessions.append(session)
        await session.open()
        driver = Driver(session)
        if not vad and not duplex:
            await driver.send(
                {
                    "type": "session.update",
                    "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}},
                }
            )
        driver.drain()
        driver.events.clear()
        driver.cursor = 0
        return driver

    yield make
    for session in sessions:
        await session.close()
