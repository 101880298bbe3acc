"""Kubernetes Events for notable transitions, derived from two statuses and one decision.

Events are for people reading `kubectl describe`: a worker created or recreated, a scale, the
deployment becoming ready or degraded (with the reason). Nothing is emitted on an idle reconcile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from omni_operator.api.status import Condition, ConditionType, OmniDeploymentStatus, Reason


@dataclass(frozen=True)
class EventSpec:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def _condition(status: OmniDeploymentStatus | None, kind: ConditionType) -> Condition | None:
    if status is None:
        return None
    return next((c for c in status.conditions if c.type is kind), None)


def status_events(previous: OmniDeploymentStatus | None, new: OmniDeploymentStatus) -> list[EventSpec]:
    out: list[EventSpec] = []
    if (
        previous is not None
        and previous.workers.desired != new.workers.desired
        and previous.observed_generation
    ):
        out.append(
            EventSpec(
                "Normal", Reason.scaled.value, f"workers {previous.workers.desired} -> {new.workers.desired}"
            )
        )
    old_ready, ready = _condition(previous, ConditionType.ready), _condition(new, ConditionType.ready)
    if ready is not None and (old_ready is None or old_ready.status != ready.status):
        if ready.status == "True":
            out.append(EventSpec("Normal", ready.reason, ready.message))
        elif old_ready is not None:
            out.append(EventSpec("Warning", ready.reason, ready.message))
    old_bad, bad = _condition(previous, ConditionType.degraded), _condition(new, ConditionType.degraded)
    if (
        bad is not None
        and bad.status == "True"
        and (old_bad is None or old_bad.status != "True" or old_bad.reason != bad.reason)
    ):
        out.append(EventSpec("Warning", bad.reason, bad.message))
    old_prog, prog = (
        _condition(previous, ConditionType.progressing),
        _condition(new, ConditionType.progressing),
    )
    if previous is not None and previous.update_revision and previous.update_revision != new.update_revision:
        out.append(
            EventSpec(
                "Normal",
                Reason.rollout_in_progress.value,
                f"revision {previous.update_revision} -> {new.update_revision}",
            )
        )
    if (
        prog is not None
        and prog.reason == Reason.rollout_paused.value
        and (old_prog is None or old_prog.reason != prog.reason)
    ):
        out.append(EventSpec("Normal", prog.reason, prog.message))
    if (
        previous is not None
        and previous.current_revision
        and previous.current_revision != new.current_revision
        and prog is not None
        and prog.reason == Reason.new_revision_available.value
    ):
        out.append(
            EventSpec(
                "Normal", prog.reason, f"rollout complete: {prog.message} (was {previous.current_revision})"
            )
        )
    if (
        prog is not None
        and prog.reason == Reason.progress_deadline_exceeded.value
        and (old_prog is None or old_prog.reason != prog.reason)
    ):
        out.append(EventSpec("Warning", prog.reason, prog.message))
    return out
