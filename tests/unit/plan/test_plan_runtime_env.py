"""spec.runtime.env in the plan: in every stage pod's container env (both targets, beside the
planner's own names), part of the worker revision when set, and absent from it when not, so
deployments keep the revision they had before the field existed."""

from __future__ import annotations

import pytest
from spec_builders import deployment, example

from omni_operator.plan import Target, plan_deployment, worker_revision

SWITCHES = {"OMNI_BUSY_STREAMS": "8", "OMNI_WARM_SPOKEN_AUDIO": "1"}


@pytest.mark.parametrize("target", list(Target))
def test_every_stage_pod_of_every_worker_carries_the_env(target: Target) -> None:
    plan = plan_deployment(deployment(**{"workers": 2, "runtime.env": SWITCHES}), target=target)
    envs = {p.name: p.container.env for w in plan.workers for p in w.pods}
    assert sorted(envs) == [f"demo-w{i}-{role}" for i in range(2) for role in ("api", "talker", "thinker")]
    for name, env in envs.items():
        own = {"CUDA_VISIBLE_DEVICES": env["CUDA_VISIBLE_DEVICES"]} if "CUDA_VISIBLE_DEVICES" in env else {}
        assert env == {**SWITCHES, **own}, name
    assert "OMNI_BUSY_STREAMS" not in plan.router.container.env


def test_the_multi_node_rendezvous_stays_beside_the_env() -> None:
    dep = deployment(
        **{
            "model.thinkerParamsBillions": 400,
            "stages.thinker.tensorParallelSize": 16,
            "runtime.env": SWITCHES,
        }
    )
    pods = {p.name: p for p in plan_deployment(dep).workers[0].pods}
    assert pods["demo-w0-thinker-1"].container.env == {
        **SWITCHES,
        "MASTER_ADDR": "thinker.demo-w0.default.svc.cluster.local",
        "MASTER_PORT": "29500",
        "NODE_RANK": "1",
        "NNODES": "2",
    }


@pytest.mark.parametrize(
    ("name", "revision"), [("tiny-cpu.yaml", "0b4aabdaa3"), ("qwen2.5-omni-7b-h100.yaml", "430e72553a")]
)
def test_without_env_the_worker_revision_is_the_one_from_before_the_field(name: str, revision: str) -> None:
    """Pinned from the commit before spec.runtime.env: an operator upgrade rolls no worker."""
    assert worker_revision(example(name).spec) == revision


def test_the_worker_revision_follows_the_env() -> None:
    revisions = {
        worker_revision(deployment(**({"runtime.env": env} if env is not None else {})).spec)
        for env in (
            None,
            {},
            {"OMNI_BUSY_STREAMS": "8"},
            {"OMNI_BUSY_STREAMS": "4"},
            {"OMNI_SUFFIX_GRAPHS": "1"},
        )
    }
    assert len(revisions) == 4  # unset and {} are one deployment
