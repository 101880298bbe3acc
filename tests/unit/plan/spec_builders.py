"""Spec builders for planner tests: the examples as objects and a fluent dotted-path builder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omni_operator.api.load import load_deployments
from omni_operator.api.spec import OmniDeployment

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def example(name: str) -> OmniDeployment:
    (dep,) = load_deployments(EXAMPLES / name)
    return dep


def deployment(name: str = "demo", **settings: Any) -> OmniDeployment:
    """An OmniDeployment from dotted camelCase settings, e.g. deployment(**{"stages.thinker.tensorParallelSize": 2})."""
    spec: dict[str, Any] = {"model": {"name": "demo-model"}}
    for dotted, value in settings.items():
        node = spec
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return OmniDeployment.model_validate({"metadata": {"name": name}, "spec": spec})


def flag(command: tuple[str, ...], name: str) -> list[str]:
    """``name`` and the value after it, wherever they stand in ``command`` ([] when absent)."""
    return [part for i, part in enumerate(command) if name in (part, command[i - 1])]
