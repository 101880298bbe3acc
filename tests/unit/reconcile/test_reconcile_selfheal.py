"""heal_decisions: a broken thinker rank recreates its whole worker; other failed pods alone."""

from __future__ import annotations

from reconcile_builders import deployment_body, plan_of, pods_of, raw_pod

from omni_operator.plan import Plan
from omni_operator.reconcile.observe import pod_view
from omni_operator.reconcile.selfheal import Heal, heal_decisions


def views(raw: list[dict]) -> list:
    return [pod_view(p) for p in raw]


def replace(raw: list[dict], name: str, **kwargs: object) -> list[dict]:
    out = []
    for p in raw:
        if p["metadata"]["name"] == name:
            labels = p["metadata"]["labels"]
            p = raw_pod(
                name, worker=labels.get("omni.dev/worker"), role=labels.get("omni.dev/role"), **kwargs
            )
        out.append(p)
    return out


def test_healthy_workers_need_nothing(plan2: Plan) -> None:
    assert heal_decisions(workers=plan2.workers, pods=views(pods_of(plan2))) == ()


def test_failed_thinker_recreates_the_whole_worker(plan2: Plan) -> None:
    raw = replace(pods_of(plan2), "qwen-w1-thinker", phase="Failed", ready=False)
    raw[4]["status"]["message"] = "CUDA error"
    assert heal_decisions(workers=plan2.workers, pods=views(raw)) == (
        Heal(
            worker="qwen-w1",
            pods=("qwen-w1-api", "qwen-w1-thinker", "qwen-w1-talker"),
            whole_worker=True,
            message="thinker pod qwen-w1-thinker failed: CUDA error",
        ),
    )


def test_failed_talker_is_recreated_alone(plan2: Plan) -> None:
    raw = replace(pods_of(plan2), "qwen-w0-talker", phase="Failed", ready=False)
    assert heal_decisions(workers=plan2.workers, pods=views(raw)) == (
        Heal(
            worker="qwen-w0",
            pods=("qwen-w0-talker",),
            whole_worker=False,
            message="pod qwen-w0-talker failed: the pod failed",
        ),
    )


def test_single_pod_thinker_restart_is_left_to_the_kubelet(plan2: Plan) -> None:
    raw = replace(pods_of(plan2), "qwen-w0-thinker", restarts=3)
    assert heal_decisions(workers=plan2.workers, pods=views(raw)) == ()


def multi_node_plan() -> Plan:
    # TP 16 on 8-GPU nodes: two thinker rank pods per worker.
    return plan_of(deployment_body(workers=1, spec={"stages": {"thinker": {"tensorParallelSize": 16}}}))


def test_restarted_rank_of_a_multi_node_thinker_recreates_the_worker() -> None:
    plan = multi_node_plan()
    raw = replace(pods_of(plan), "qwen-w0-thinker-1", restarts=1)
    (heal,) = heal_decisions(workers=plan.workers, pods=views(raw))
    assert heal == Heal(
        worker="qwen-w0",
        pods=("qwen-w0-api", "qwen-w0-thinker", "qwen-w0-thinker-1", "qwen-w0-talker"),
        whole_worker=True,
        message="thinker rank pod qwen-w0-thinker-1 restarted (1x) and left its tensor-parallel group",
    )


def test_vanished_rank_while_peers_run_recreates_the_worker() -> None:
    plan = multi_node_plan()
    raw = [p for p in pods_of(plan) if p["metadata"]["name"] != "qwen-w0-thinker"]
    (heal,) = heal_decisions(workers=plan.workers, pods=views(raw))
    assert heal.whole_worker
    assert heal.pods == ("qwen-w0-api", "qwen-w0-thinker-1", "qwen-w0-talker")
    assert heal.message == "thinker rank pod qwen-w0-thinker is gone while its peers run"


def test_rank_not_yet_created_while_peers_are_pending_is_no_failure() -> None:
    plan = multi_node_plan()
    raw = [
        p
        for p in pods_of(plan, phase="Pending", ready=False, started=False)
        if not p["metadata"]["name"].endswith("-1")
    ]
    assert heal_decisions(workers=plan.workers, pods=views(raw)) == ()


def test_terminating_pods_are_not_healed_twice(plan2: Plan) -> None:
    raw = replace(pods_of(plan2), "qwen-w1-thinker", phase="Failed", ready=False, terminating=True)
    assert heal_decisions(workers=plan2.workers, pods=views(raw)) == ()
