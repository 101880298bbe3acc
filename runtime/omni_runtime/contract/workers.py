"""Worker states: one vocabulary for the worker table the control plane writes and the router reads.

The operator publishes each worker's state (OmniDeployment status, the worker Service's
annotation, `omni up`'s workers.json); the router admits sessions only to ``ready`` workers and
lets ``draining`` ones finish theirs.
"""

from __future__ import annotations

from enum import StrEnum


class WorkerState(StrEnum):
    starting = "starting"  # created, not yet ready and warmed up
    ready = "ready"  # complete, ready and admitted: takes new sessions
    draining = "draining"  # takes no new sessions; live ones finish (or the drain deadline passes)
    gone = "gone"  # removed
