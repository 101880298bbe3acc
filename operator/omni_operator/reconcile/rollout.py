"""The seam for the worker-by-worker rollout state machine (a later issue).

Today a changed pod template is replaced in place as soon as the diff sees it (all outdated pods
at once). The rollout issue replaces `gate_replacements` with the DESIGN's state machine:
surge a new worker (spec.rollout.maxSurge), wait until it is ready and admitted by the router,
mark an old worker `draining` (labels.WORKER_STATE on its Service, labels.DRAIN_STARTED),
wait for its sessions or spec.rollout.drainTimeoutSeconds, then delete it; stop when
spec.rollout.paused or the progress deadline passes. Its inputs are already here: the plan's
worker revisions, the observed pods (PodView.worker_revision / pod_revision) and the diff.
"""

from __future__ import annotations

from omni_operator.api.spec import RolloutSpec
from omni_operator.reconcile.diff import ChildDiff


def gate_replacements(diff: ChildDiff, *, rollout: RolloutSpec) -> ChildDiff:
    """Which replacements of outdated children may happen now. Currently: all of them."""
    del rollout  # used by the rollout state machine
    return diff
