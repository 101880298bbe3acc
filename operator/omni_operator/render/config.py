"""The deployment's ConfigMap: the plan itself and the runtime config files it calls for."""

from __future__ import annotations

from omni_operator.plan.types import Plan
from omni_operator.render.common import Manifest, Owner, common_labels, metadata

CONFIG_MOUNT = "/etc/omni"  # the planner's CONFIG_DIR: commands name files under it
PLAN_KEY = "plan.json"


def config_map_name(plan: Plan) -> str:
    return f"{plan.deployment}-config"


def config_map(plan: Plan, *, owner: Owner | None = None) -> Manifest:
    data = {PLAN_KEY: plan.model_dump_json(indent=2), **plan.config_files}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(config_map_name(plan), plan, labels_=common_labels(plan, "config"), owner=owner),
        "data": data,
    }
