"""OmniDeployment status models, condition types and reason constants."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from omni_runtime.contract.workers import WorkerState


class StatusModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Phase(StrEnum):
    pending = "Pending"
    progressing = "Progressing"
    ready = "Ready"
    degraded = "Degraded"
    failed = "Failed"


class ConditionType(StrEnum):
    ready = "Ready"
    progressing = "Progressing"
    degraded = "Degraded"


class Reason(StrEnum):
    """Reason constants for conditions and events (CamelCase, as Kubernetes does)."""

    all_workers_ready = "AllWorkersReady"
    workers_not_ready = "WorkersNotReady"
    no_workers = "NoWorkers"
    new_revision_available = "NewRevisionAvailable"
    rollout_in_progress = "RolloutInProgress"
    rollout_paused = "RolloutPaused"
    progress_deadline_exceeded = "ProgressDeadlineExceeded"
    insufficient_gpus = "InsufficientGPUs"
    unschedulable = "Unschedulable"
    stage_failed = "StageFailed"
    invalid_spec = "InvalidSpec"
    reconcile_error = "ReconcileError"  # a reconcile pass raised something other than an API error
    reconciled = "Reconciled"
    worker_recreated = "WorkerRecreated"
    worker_draining = "WorkerDraining"
    worker_updating = "WorkerUpdating"  # a drained worker's changed pods are replaced in place
    worker_restored = "WorkerRestored"  # a draining worker of the update revision serves again (revert)
    worker_deleted = "WorkerDeleted"
    worker_created = "WorkerCreated"
    scaled = "Scaled"


class Condition(StatusModel):
    type: ConditionType
    status: str = Field(pattern="^(True|False|Unknown)$")
    reason: str
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class WorkerCounts(StatusModel):
    desired: int = 0
    ready: int = 0
    updated: int = 0
    available: int = 0


class StageReadiness(StatusModel):
    desired: int = 0
    ready: int = 0


class WorkerStatus(StatusModel):
    name: str
    revision: str
    state: WorkerState


class OmniDeploymentStatus(StatusModel):
    observed_generation: int | None = None
    phase: Phase = Phase.pending
    conditions: list[Condition] = Field(default_factory=list)
    workers: WorkerCounts = Field(default_factory=WorkerCounts)
    replicas: int = Field(default=0, description="Workers that exist (the scale subresource's status path).")
    stages: dict[str, StageReadiness] = Field(default_factory=dict)
    worker_states: list[WorkerStatus] = Field(default_factory=list)
    current_revision: str | None = None
    update_revision: str | None = None
    endpoint: str | None = None
    selector: str | None = None
