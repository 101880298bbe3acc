"""Pure placement planner: OmniDeployment spec -> Plan.

`plan_deployment` is the entry point; `PlanError` carries the field, the reason and the fix.
"""

from omni_operator.plan.planner import plan_deployment
from omni_operator.plan.revisions import pod_revision, worker_revision
from omni_operator.plan.types import Plan, PlanError, Role, Stage, StagePod, Target, WorkerPlan

__all__ = [
    "Plan",
    "PlanError",
    "Role",
    "Stage",
    "StagePod",
    "Target",
    "WorkerPlan",
    "plan_deployment",
    "pod_revision",
    "worker_revision",
]
