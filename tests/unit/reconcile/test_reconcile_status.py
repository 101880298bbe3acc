"""compute_status: exact statuses for the situations an operator meets."""

from __future__ import annotations

import pytest
from reconcile_builders import EARLIER, NOW, deployment_body, plan_of, pods_of, raw_pod

from omni_operator.api.status import OmniDeploymentStatus
from omni_operator.plan import Plan
from omni_operator.reconcile.observe import pod_view
from omni_operator.reconcile.status import (
    compute_status,
    error_message,
    invalid_spec_status,
    reconcile_error_status,
    status_body,
)

ENDPOINT = "http://qwen-router.ns.svc.cluster.local:8000"
SELECTOR = "omni.dev/deployment=qwen"
GPU_MESSAGE = "0/5 nodes are available: 4 Insufficient nvidia.com/gpu, 1 node(s) didn't match selector."


def status(
    plan: Plan, raw: list[dict], *, previous: OmniDeploymentStatus | None = None, now: str = NOW
) -> dict:
    return status_body(
        compute_status(
            plan=plan,
            pods=[pod_view(p) for p in raw],
            generation=3,
            previous=previous,
            now=now,
            endpoint=ENDPOINT,
            selector=SELECTOR,
            progress_deadline_seconds=600,
        )
    )


def cond(kind: str, value: str, reason: str, message: str, at: str = NOW) -> dict:
    return {
        "type": kind,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": at,
        "observedGeneration": 3,
    }


def stages(plan: Plan, ready: int) -> dict:
    return {s.value: {"desired": 2, "ready": ready} for s in plan.stages}


def test_all_workers_ready(plan2: Plan) -> None:
    rev = plan2.revision
    assert status(plan2, pods_of(plan2)) == {
        "observedGeneration": 3,
        "phase": "Ready",
        "conditions": [
            cond("Ready", "True", "AllWorkersReady", "2/2 workers ready"),
            cond("Progressing", "True", "NewRevisionAvailable", f"2 worker(s) run revision {rev}"),
            cond("Degraded", "False", "Reconciled", ""),
        ],
        "workers": {"desired": 2, "ready": 2, "updated": 2, "available": 2},
        "replicas": 2,
        "stages": stages(plan2, 2),
        "workerStates": [
            {"name": "qwen-w0", "revision": rev, "state": "ready"},
            {"name": "qwen-w1", "revision": rev, "state": "ready"},
        ],
        "currentRevision": rev,
        "updateRevision": rev,
        "endpoint": ENDPOINT,
        "selector": SELECTOR,
    }


def test_fresh_deployment_is_progressing(plan2: Plan) -> None:
    body = status(plan2, [])
    assert body["phase"] == "Progressing"
    assert body["conditions"] == [
        cond("Ready", "False", "WorkersNotReady", "0/2 workers ready"),
        cond(
            "Progressing", "True", "RolloutInProgress", f"0/2 workers available at revision {plan2.revision}"
        ),
        cond("Degraded", "False", "Reconciled", ""),
    ]
    assert body["workers"] == {"desired": 2, "ready": 0, "updated": 0, "available": 0}
    assert body["replicas"] == 0
    assert "currentRevision" not in body
    assert [w["state"] for w in body["workerStates"]] == ["starting", "starting"]


def test_too_few_gpus_is_a_condition_reason(plan2: Plan) -> None:
    raw = pods_of(plan2)
    for p in raw:
        if p["metadata"]["name"] in ("qwen-w1-thinker", "qwen-w1-talker"):
            p.update(
                raw_pod(
                    p["metadata"]["name"],
                    worker="qwen-w1",
                    phase="Pending",
                    ready=False,
                    unschedulable=GPU_MESSAGE,
                    started=False,
                )
            )
    body = status(plan2, raw)
    assert body["phase"] == "Degraded"
    assert body["conditions"][2] == cond(
        "Degraded",
        "True",
        "InsufficientGPUs",
        "2 pod(s) cannot be scheduled for lack of nvidia.com/gpu (qwen-w1-talker, qwen-w1-thinker): "
        f"{GPU_MESSAGE}; add GPU nodes or lower spec.workers",
    )
    assert body["workers"] == {"desired": 2, "ready": 1, "updated": 1, "available": 1}
    assert body["stages"]["thinker"] == {"desired": 2, "ready": 1}
    assert body["stages"]["preprocessing"] == {"desired": 2, "ready": 2}
    assert [w["state"] for w in body["workerStates"]] == ["ready", "starting"]


def test_nothing_schedulable_is_pending(plan2: Plan) -> None:
    raw = pods_of(plan2, phase="Pending", ready=False, unschedulable=GPU_MESSAGE, started=False)
    body = status(plan2, raw)
    assert body["phase"] == "Pending"
    assert body["conditions"][2]["reason"] == "InsufficientGPUs"


def test_other_unschedulable_reason(plan2: Plan) -> None:
    raw = pods_of(
        plan2, phase="Pending", ready=False, unschedulable="0/5 nodes are available: taints", started=False
    )
    assert status(plan2, raw)["conditions"][2]["reason"] == "Unschedulable"


def test_recomputing_an_unchanged_world_gives_an_equal_status(plan2: Plan) -> None:
    first = status(plan2, [], now=EARLIER)
    again = status(plan2, [], previous=OmniDeploymentStatus.model_validate(first), now=NOW)
    assert again == first


def test_progress_deadline_exceeded_then_recovers(plan2: Plan) -> None:
    first = OmniDeploymentStatus.model_validate(status(plan2, [], now=EARLIER))
    stuck = status(plan2, [], previous=first, now="2026-01-01T00:10:01Z")
    assert stuck["conditions"][1] == cond(
        "Progressing",
        "False",
        "ProgressDeadlineExceeded",
        "no progress for 600 s: 0/2 workers available",
        at="2026-01-01T00:10:01Z",
    )
    still = status(plan2, [], previous=OmniDeploymentStatus.model_validate(stuck), now="2026-01-01T00:20:00Z")
    assert still == stuck
    recovered = status(plan2, pods_of(plan2), previous=OmniDeploymentStatus.model_validate(stuck))
    assert recovered["conditions"][1]["reason"] == "NewRevisionAvailable"


def test_outdated_pods_are_ready_but_not_updated(plan2: Plan) -> None:
    body = status(plan2, pods_of(plan2, pod_revision="old", revision="old-rev"))
    assert body["workers"] == {"desired": 2, "ready": 2, "updated": 0, "available": 0}
    assert body["currentRevision"] == "old-rev"
    assert body["updateRevision"] == plan2.revision
    assert body["phase"] == "Progressing"


def test_surplus_worker_keeps_the_rollout_open() -> None:
    plan1 = plan_of(deployment_body(workers=1))
    raw = pods_of(plan_of(deployment_body(workers=2)))
    body = status(plan1, raw)
    assert body["replicas"] == 2
    assert body["conditions"][1]["message"].endswith(", 1 to remove")
    assert body["phase"] == "Progressing"


def test_zero_workers() -> None:
    body = status(plan_of(deployment_body(workers=0)), [])
    assert body["phase"] == "Ready"
    assert body["conditions"][0] == cond("Ready", "True", "NoWorkers", "spec.workers is 0")
    assert body["stages"]["thinker"] == {"desired": 0, "ready": 0}


def test_invalid_spec_keeps_counts_and_says_why(plan2: Plan) -> None:
    previous = OmniDeploymentStatus.model_validate(status(plan2, pods_of(plan2), now=EARLIER))
    body = status_body(
        invalid_spec_status(message="spec.x: bad; fix it", generation=4, previous=previous, now=NOW)
    )
    assert body["phase"] == "Failed"
    assert body["observedGeneration"] == 4
    assert body["workers"] == {"desired": 2, "ready": 2, "updated": 2, "available": 2}
    assert [(c["type"], c["status"], c["reason"], c["message"]) for c in body["conditions"]] == [
        ("Ready", "False", "InvalidSpec", "spec.x: bad; fix it"),
        ("Progressing", "False", "InvalidSpec", "spec.x: bad; fix it"),
        ("Degraded", "True", "InvalidSpec", "spec.x: bad; fix it"),
    ]


@pytest.mark.parametrize(
    ("error", "limit", "message"),
    [
        (ValueError("bad port"), 1024, "ValueError: bad port"),
        (KeyError("thinker"), 1024, "KeyError: 'thinker'"),
        (RuntimeError("line one\n  line two\tend"), 1024, "RuntimeError: line one line two end"),
        (ValueError(), 1024, "ValueError:"),
        (ValueError("x" * 20), 20, "ValueError: xxxxx..."),
        (ValueError("x" * 8), 20, "ValueError: xxxxxxxx"),
    ],
)
def test_error_message(error: BaseException, limit: int, message: str) -> None:
    assert error_message(error, limit=limit) == message


def test_error_message_is_capped_at_the_event_limit() -> None:
    assert len(error_message(ValueError("x" * 5000))) == 1024


@pytest.mark.parametrize(
    ("previous", "phase", "conditions"),
    [
        (
            None,
            "Degraded",
            [
                ("Ready", "False", "ReconcileError", "ValueError: bad", NOW),
                ("Degraded", "True", "ReconcileError", "ValueError: bad", NOW),
            ],
        ),
        (
            "ready",  # Progressing is kept as the last good pass wrote it
            "Degraded",
            [
                ("Ready", "False", "ReconcileError", "ValueError: bad", NOW),
                ("Progressing", "True", "NewRevisionAvailable", "2 worker(s) run revision {rev}", EARLIER),
                ("Degraded", "True", "ReconcileError", "ValueError: bad", NOW),
            ],
        ),
        (
            "failing",  # a second failure keeps the transition times of the first
            "Degraded",
            [
                ("Ready", "False", "ReconcileError", "ValueError: bad", EARLIER),
                ("Progressing", "True", "NewRevisionAvailable", "2 worker(s) run revision {rev}", EARLIER),
                ("Degraded", "True", "ReconcileError", "ValueError: bad", EARLIER),
            ],
        ),
    ],
)
def test_reconcile_error_status(
    plan2: Plan, previous: str | None, phase: str, conditions: list[tuple[str, ...]]
) -> None:
    prev = None
    if previous is not None:
        prev = OmniDeploymentStatus.model_validate(status(plan2, pods_of(plan2), now=EARLIER))
    if previous == "failing":
        prev = reconcile_error_status(message="ValueError: bad", generation=3, previous=prev, now=EARLIER)
    body = status_body(
        reconcile_error_status(message="ValueError: bad", generation=3, previous=prev, now=NOW)
    )
    assert body["phase"] == phase
    assert [
        (c["type"], c["status"], c["reason"], c["message"], c["lastTransitionTime"])
        for c in body["conditions"]
    ] == [tuple(part.format(rev=plan2.revision) for part in c) for c in conditions]
    if prev is not None:  # counts, revisions and the endpoint stay as the last good pass saw them
        assert {k: v for k, v in body.items() if k not in ("phase", "conditions")} == {
            k: v for k, v in status_body(prev).items() if k not in ("phase", "conditions")
        }
