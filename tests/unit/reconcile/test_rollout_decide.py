"""Rollouts through decide, on an imagined cluster (rollout_world.py): the real planner, renderer and
state machine, pass after pass, with the invariants checked at every pass."""

from __future__ import annotations

import json

from reconcile_builders import deployment_body, plan_of
from rollout_world import START, World, stamp

from omni_operator.api import labels
from omni_operator.reconcile.diff import APPLIED_HASH, manifest_hash
from omni_operator.reconcile.workers import TEMPLATE_HASH

TALKER_2 = {"stages": {"talker": {"image": "talker:2"}}}


def settled(*, workers: int = 3, **rollout: object) -> World:
    world = World(deployment_body(workers=workers, spec={"rollout": rollout}))
    for _ in range(3):
        world.pass_()
    return world


def revision(world: World) -> str:
    return plan_of(world.body).revision[:4]


def check_invariants(world: World, *, desired: int, surge: int, unavailable: int) -> None:
    serving = [w for w, s in world.workers().items() if s.endswith(":ready")]
    names = {(o["metadata"].get("labels") or {}).get(labels.WORKER) for o in world.objects.values()} - {None}
    assert len(serving) >= desired - unavailable, world.workers()
    assert len(names) <= desired + surge, sorted(names)


def roll(world: World, passes: int, *, surge: int = 1, unavailable: int = 0) -> list[dict[str, str]]:
    """Distinct worker tables, pass by pass, each checked against the strategy."""
    seen: list[dict[str, str]] = []
    for _ in range(passes):
        world.pass_()
        check_invariants(world, desired=3, surge=surge, unavailable=unavailable)
        if not seen or seen[-1] != world.workers():
            seen.append(world.workers())
    return seen


def reasons(world: World) -> list[str]:
    return [e.reason for d in world.log for e in d.events]


def test_talker_change_rolls_worker_by_worker_and_keeps_the_thinkers() -> None:
    world = settled(drainTimeoutSeconds=2)
    r0 = revision(world)
    events_before = len(reasons(world))
    world.set_spec(**TALKER_2)
    r1 = revision(world)
    seq = roll(world, 24)
    a, b = f"{r0}:ready", f"{r1}:ready"
    s, d = f"{r1}:starting", f"{r0}:draining"
    assert [[t.get(f"qwen-w{i}", "-") for i in range(4)] for t in seq] == [
        [a, a, a, s],  # surge one worker (maxSurge 1)
        [a, a, a, b],  # it is ready: the router is told
        [d, a, a, b],  # then the lowest old worker drains (maxUnavailable 0: 3 still serve)
        [s, a, a, b],  # drained: only its talker pod is replaced
        [b, a, a, b],
        [b, d, a, b],
        [b, s, a, b],
        [b, b, a, b],
        [b, b, d, b],  # enough workers at r1: the last old one drains
        [b, b, "-", b],  # and is deleted
    ]
    pods = {n: o for (kind, n), o in world.objects.items() if kind == "Pod"}
    assert sorted(pods) == [f"qwen-w{i}-{r}" for i in (0, 1, 3) for r in ("api", "talker", "thinker")]
    for i in (0, 1):  # api and thinker pods lived through the update; the talker is new
        assert pods[f"qwen-w{i}-thinker"]["metadata"]["creationTimestamp"] == stamp(START)
        assert pods[f"qwen-w{i}-api"]["metadata"]["creationTimestamp"] == stamp(START)
        assert pods[f"qwen-w{i}-talker"]["metadata"]["creationTimestamp"] != stamp(START)
        assert pods[f"qwen-w{i}-talker"]["spec"]["containers"][0]["image"] == "talker:2"
    assert reasons(world)[events_before:] == [
        "WorkerCreated",
        "RolloutInProgress",
        "WorkerDraining",
        "WorkerUpdating",
        "WorkerDraining",
        "WorkerUpdating",
        "WorkerDraining",
        "WorkerDeleted",
        "NewRevisionAvailable",
    ]
    status = world.body["status"]
    assert status["workers"] == {"desired": 3, "ready": 3, "updated": 3, "available": 3}
    assert (status["currentRevision"][:4], status["updateRevision"][:4]) == (r1, r1)
    assert [(w["name"], w["state"]) for w in status["workerStates"]] == [
        ("qwen-w0", "ready"),
        ("qwen-w1", "ready"),
        ("qwen-w3", "ready"),
    ]
    assert world.pass_().writes == 0  # done: idle again


def test_drain_is_stamped_reported_and_ends_when_every_router_reports_zero() -> None:
    world = settled(drainTimeoutSeconds=600)
    world.set_spec(**TALKER_2)
    roll(world, 4)
    service = world.objects[("Service", "qwen-w0")]["metadata"]["annotations"]
    assert service[labels.WORKER_STATE] == "draining"
    started = service[labels.DRAIN_STARTED]
    assert started == stamp(START.replace(second=6))
    status = world.body["status"]
    assert [w["state"] for w in status["workerStates"]] == ["draining", "ready", "ready", "ready"]
    assert world.log[-1].requeue_after == 601.0  # look again once the drain timeout has passed

    def report(sessions: int, drain: str = started) -> None:
        service["live-sessions.omni.dev/qwen-router-abc"] = json.dumps({"drain": drain, "sessions": sessions})

    report(1)
    world.pass_()
    assert world.workers()["qwen-w0"].endswith(":draining")
    report(0, drain="2025-12-31T00:00:00Z")  # a report about an older drain says nothing
    world.pass_()
    assert world.workers()["qwen-w0"].endswith(":draining")
    report(0)
    d = world.pass_()
    assert [e.reason for e in d.events] == ["WorkerUpdating"]
    after = world.objects[("Service", "qwen-w0")]["metadata"]["annotations"]
    assert after[labels.WORKER_STATE] == "starting"
    assert labels.DRAIN_STARTED not in after and not any(k.startswith("live-sessions.") for k in after)


def test_revert_mid_drain_restores_the_draining_worker_and_replaces_no_pod() -> None:
    world = settled(drainTimeoutSeconds=30)
    r0 = revision(world)
    uids_before = {n: o["metadata"]["creationTimestamp"] for (k, n), o in world.objects.items() if k == "Pod"}
    world.set_spec(**TALKER_2)
    roll(world, 4)
    assert world.workers()["qwen-w0"] == f"{r0}:draining"
    world.set_spec(stages={})
    d = world.pass_()
    assert [e.reason for e in d.events] == ["WorkerRestored", "RolloutInProgress"]
    seq = roll(world, 40)
    assert [t.get("qwen-w0") for t in seq][:1] == [f"{r0}:ready"]
    assert seq[-1] == {f"qwen-w{i}": f"{r0}:ready" for i in range(3)}
    assert {n: c for n, c in uids_before.items()} == {
        n: o["metadata"]["creationTimestamp"] for (k, n), o in world.objects.items() if k == "Pod"
    }
    assert world.body["status"]["conditions"][1]["reason"] == "NewRevisionAvailable"


def test_revert_after_an_in_place_update_respects_max_unavailable() -> None:
    world = settled(drainTimeoutSeconds=1)
    r0 = revision(world)
    world.set_spec(**TALKER_2)
    r1 = revision(world)
    roll(world, 6)
    assert world.workers()["qwen-w0"] == f"{r1}:starting"
    world.set_spec(stages={})
    seq = roll(world, 40)
    assert seq[-1] == {f"qwen-w{i}": f"{r0}:ready" for i in range(3)}
    assert world.objects[("Pod", "qwen-w0-talker")]["spec"]["containers"][0]["image"] != "talker:2"


def test_progress_deadline_stops_the_rollout_and_a_revert_recovers() -> None:
    world = settled(drainTimeoutSeconds=1, progressDeadlineSeconds=4)
    r0 = revision(world)
    nowhere = {"gpu": {"tier": "h100", "nodeSelector": {"nowhere": "x"}}}
    world.set_spec(**nowhere)
    seq = roll(world, 10)
    assert [t.get("qwen-w3", "-").split(":")[1] for t in seq] == ["starting"]
    assert all(world.workers()[f"qwen-w{i}"] == f"{r0}:ready" for i in range(3))
    progressing = world.body["status"]["conditions"][1]
    assert (progressing["status"], progressing["reason"]) == ("False", "ProgressDeadlineExceeded")
    assert progressing["message"].startswith("worker qwen-w3 not ready 4 s after its pods were created")
    assert reasons(world).count("ProgressDeadlineExceeded") == 1
    world.set_spec(gpu={"tier": "h100"})
    seq = roll(world, 6)
    assert seq[-1] == {f"qwen-w{i}": f"{r0}:ready" for i in range(3)}
    assert world.body["status"]["conditions"][1]["reason"] == "NewRevisionAvailable"


def test_pause_stops_at_the_next_step_and_resume_finishes() -> None:
    world = settled(drainTimeoutSeconds=2)
    world.set_spec(**TALKER_2)
    roll(world, 4)  # w0 draining
    world.set_spec(rollout={"drainTimeoutSeconds": 2, "paused": True})
    r1 = revision(world)
    roll(world, 15)
    table = world.workers()
    assert (table["qwen-w0"], table["qwen-w3"]) == (f"{r1}:ready", f"{r1}:ready")  # the step under way ended
    assert table["qwen-w1"].endswith(":ready") and not table["qwen-w1"].startswith(r1)  # and no other began
    progressing = world.body["status"]["conditions"][1]
    assert (progressing["status"], progressing["reason"]) == ("Unknown", "RolloutPaused")
    assert "RolloutPaused" in reasons(world)
    assert world.pass_().writes == 0
    world.set_spec(rollout={"drainTimeoutSeconds": 2})
    seq = roll(world, 20)
    assert seq[-1] == {f"qwen-w{i}": f"{r1}:ready" for i in (0, 1, 3)}


def test_max_unavailable_one_updates_in_place_without_surge() -> None:
    world = settled(drainTimeoutSeconds=1, maxSurge=0, maxUnavailable=1)
    world.set_spec(**TALKER_2)
    r1 = revision(world)
    seq = roll(world, 24, surge=0, unavailable=1)
    assert seq[-1] == {f"qwen-w{i}": f"{r1}:ready" for i in range(3)}
    assert max(len(t) for t in seq) == 3


def test_pods_created_before_template_hashes_are_not_replaced() -> None:
    world = settled()
    for (kind, _), obj in world.objects.items():
        if kind == "Pod":  # as the previous operator left them: no template hash, hash of the render
            meta = obj["metadata"]
            del meta["annotations"][TEMPLATE_HASH]
            rendered = {k: v for k, v in obj.items() if k != "status"}
            rendered["metadata"] = {k: v for k, v in meta.items() if k != "creationTimestamp"}
            meta["annotations"][APPLIED_HASH] = manifest_hash(rendered)
    assert world.pass_().writes == 0
