"""A reconnect that claims a duplex session before the old socket's drop is noticed keeps it."""

from __future__ import annotations

from rt_helpers import EnergyScorer
from rt_scripted_engine import ScriptedEngine

from omni_runtime.realtime.metrics import RealtimeMetrics
from omni_runtime.realtime.session.endpoint import RealtimeSessions
from omni_runtime.realtime.session.session import RealtimeSession
from omni_runtime.realtime.settings import RealtimeSettings


async def test_the_old_sockets_teardown_leaves_a_claimed_session_alone() -> None:
    settings = RealtimeSettings(worker_id="w0")
    metrics = RealtimeMetrics(settings=settings)
    sessions = RealtimeSessions(settings=settings, metrics=metrics)
    session = RealtimeSession(
        engine=ScriptedEngine(),
        settings=settings,
        metrics=metrics,
        duplex=True,
        beta=False,
        scorer_factory=EnergyScorer,
    )
    old = sessions.add(session)
    new = sessions.claim(session.id)  # the reconnect arrives first
    assert new is not None and old.kick.is_set()
    sessions.detach(old)  # then the old socket's drop is handled: a no-op
    assert old.expiry is None and sessions.get(session.id) is session
    await sessions.remove(old)  # likewise: the session stays open for the new socket
    assert sessions.get(session.id) is session and len(sessions) == 1
    await sessions.close_all()
