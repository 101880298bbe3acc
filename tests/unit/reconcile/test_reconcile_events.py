"""status_events: exactly the transitions people want in `kubectl describe`, nothing when idle."""

from __future__ import annotations

from omni_operator.api.status import Condition, ConditionType, OmniDeploymentStatus, WorkerCounts
from omni_operator.reconcile.events import EventSpec, status_events


def st(
    ready: str,
    degraded: tuple[str, str] = ("False", "Reconciled"),
    *,
    desired: int = 2,
    progressing: str = "RolloutInProgress",
) -> OmniDeploymentStatus:
    return OmniDeploymentStatus(
        observed_generation=1,
        workers=WorkerCounts(desired=desired),
        conditions=[
            Condition(type=ConditionType.ready, status=ready, reason="R", message=f"ready {ready}"),
            Condition(type=ConditionType.progressing, status="True", reason=progressing, message="p"),
            Condition(type=ConditionType.degraded, status=degraded[0], reason=degraded[1], message="why"),
        ],
    )


def test_first_status_not_ready_is_quiet() -> None:
    assert status_events(None, st("False")) == []


def test_becoming_ready_and_losing_it() -> None:
    assert status_events(st("False"), st("True")) == [EventSpec("Normal", "R", "ready True")]
    assert status_events(st("True"), st("False")) == [EventSpec("Warning", "R", "ready False")]


def test_degraded_reason_is_announced_once() -> None:
    gpus = ("True", "InsufficientGPUs")
    assert status_events(st("False"), st("False", gpus)) == [EventSpec("Warning", "InsufficientGPUs", "why")]
    assert status_events(st("False", gpus), st("False", gpus)) == []


def test_scale_and_deadline() -> None:
    assert status_events(st("True", desired=2), st("True", desired=4)) == [
        EventSpec("Normal", "Scaled", "workers 2 -> 4")
    ]
    late = st("False", progressing="ProgressDeadlineExceeded")
    assert status_events(st("False"), late) == [EventSpec("Warning", "ProgressDeadlineExceeded", "p")]
