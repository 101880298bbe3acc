"""The rollout core: the counting rules every rolling upgrade of omni workers follows, in local mode
(`omni up`, local/rollout.py) and on Kubernetes (reconcile/rollout.py). Pure: no kopf, no
Kubernetes client, no I/O."""

from omni_operator.rollout.core import (
    Count,
    Stop,
    Strategy,
    WorkerState,
    WorkerView,
    count,
    deadline_left,
    drain_budget,
    drain_end,
    drain_left,
    order,
    scale_down,
    surge_room,
)

__all__ = [
    "Count",
    "Stop",
    "Strategy",
    "WorkerState",
    "WorkerView",
    "count",
    "deadline_left",
    "drain_budget",
    "drain_end",
    "drain_left",
    "order",
    "scale_down",
    "surge_room",
]
