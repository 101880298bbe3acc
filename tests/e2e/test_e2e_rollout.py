"""Rollouts on the real control plane: worker by worker, paused and resumed, stuck, reverted.

The test polls the worker Services (what the router's Kubernetes source reads: revision label and
state annotation) and the pods, records every distinct worker table, and checks the strategy at
each observation: never fewer serving workers than `workers - maxUnavailable`, never more workers
in existence (terminating ones included) than `workers + maxSurge`. kwok runs the pods, so a pod is
Ready once bound; no router runs, so a drain lasts drainTimeoutSeconds (short here).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from e2e_cluster import ControlPlane
from e2e_operator import Api, condition, deployment, running_operator, uids

from omni_operator.api import labels

pytestmark = pytest.mark.e2e

TALKER_2 = {"stages": {"talker": {"image": "ghcr.io/omni/runtime:talker-2"}}}
TALKER_BACK = {"stages": {"talker": {"image": None}}}


def table(api: Api, name: str) -> tuple[dict[str, str], int, int]:
    """(worker -> 'revision:state' as the router reads it, serving workers, workers in existence)."""
    services = [s for s in api.services(name) if s["metadata"]["labels"].get(labels.COMPONENT) == "worker"]
    pods = api.pods(name)
    ready_pods: dict[str, list[bool]] = {}
    for p in pods:
        conditions = {c["type"]: c["status"] for c in p.get("status", {}).get("conditions", [])}
        ok = conditions.get("Ready") == "True" and not p["metadata"].get("deletionTimestamp")
        ready_pods.setdefault(p["metadata"]["labels"][labels.WORKER], []).append(ok)
    out, serving = {}, 0
    for s in services:
        meta = s["metadata"]
        state = (meta.get("annotations") or {}).get(labels.WORKER_STATE, "ready")
        out[meta["name"]] = f"{meta['labels'][labels.REVISION]}:{state}"
        if state == "ready" and all(ready_pods.get(meta["name"], [False])):
            serving += 1
    existing = {p["metadata"]["labels"][labels.WORKER] for p in pods} | set(out)
    return out, serving, len(existing)


@dataclass
class Recorder:
    """Polls one deployment, keeps each distinct worker table, asserts the strategy every time."""

    api: Api
    name: str
    workers: int
    surge: int = 1
    unavailable: int = 0
    tables: list[dict[str, str]] = field(default_factory=list)
    observations: int = 0

    def observe(self) -> dict[str, Any]:
        current, serving, existing = table(self.api, self.name)
        self.observations += 1
        assert serving >= self.workers - self.unavailable, (serving, current)
        assert existing <= self.workers + self.surge, (existing, current)
        if not self.tables or self.tables[-1] != current:
            self.tables.append(current)
        body = self.api.get(self.name)
        assert body is not None
        return body.get("status") or {}

    def until(self, what: str, check: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            status = self.observe()
            if check(status):
                return status
            assert time.monotonic() < deadline, f"{self.name}: {what} not reached; tables: {self.tables[-5:]}"
            time.sleep(0.1)

    def history(self, worker: str) -> list[str]:
        """One worker's states in order (consecutive repeats folded)."""
        out: list[str] = []
        for t in self.tables:
            state = t.get(worker, "gone")
            if not out or out[-1] != state:
                out.append(state)
        return out


def progressing(status: dict[str, Any]) -> tuple[str, str]:
    cond = next((c for c in status.get("conditions", []) if c["type"] == "Progressing"), {})
    return cond.get("status", ""), cond.get("reason", "")


def complete(revision: str | None = None) -> Callable[[dict[str, Any]], bool]:
    def check(st: dict[str, Any]) -> bool:
        return (
            progressing(st) == ("True", "NewRevisionAvailable")
            and st.get("currentRevision") == st.get("updateRevision")
            and (revision is None or st.get("updateRevision") == revision)
            and [w["state"] for w in st.get("workerStates", [])] == ["ready"] * 3
        )

    return check


def start(api: Api, name: str, **rollout: Any) -> tuple[str, dict[str, str]]:
    api.create(deployment(name, workers=3, spec={"rollout": rollout}))
    status = api.wait_ready(name, 3)
    return status["updateRevision"], uids(api.pods(name))


def test_talker_change_replaces_worker_by_worker(crds: ControlPlane, api: Api, namespace: str) -> None:
    with running_operator(crds, namespace):
        # Each drain must fall between two polls: 3 s leaves room for a slow poll on a loaded machine
        # (a 1 s drain was missed once behind a 720 ms garbage-collection pause).
        r0, pods_before = start(api, "roll", drainTimeoutSeconds=3)
        rec = Recorder(api, "roll", workers=3)
        rec.observe()
        api.patch_spec("roll", TALKER_2)
        status = rec.until("rolled out", lambda st: st.get("updateRevision") != r0 and complete()(st))
        r1 = status["updateRevision"]
        print(f"\nobserved worker tables ({rec.observations} observations):")
        for t in rec.tables:
            print("  ", {w: s.replace(r0, "r0").replace(r1, "r1") for w, s in sorted(t.items())})

        def folded(worker: str) -> list[str]:  # a short `starting` may fall between two polls
            hist = [s.replace(r0, "r0").replace(r1, "r1") for s in rec.history(worker)]
            return [s for s in hist if s != "r1:starting"]

        assert folded("roll-w3") == ["gone", "r1:ready"]
        assert folded("roll-w0") == ["r0:ready", "r0:draining", "r1:ready"]
        assert folded("roll-w1") == ["r0:ready", "r0:draining", "r1:ready"]
        assert folded("roll-w2") == ["r0:ready", "r0:draining", "gone"]

        def first(entry: str, worker: str) -> int:
            return next(i for i, t in enumerate(rec.tables) if t.get(worker) == entry)

        # One step at a time: surge, drain w0, w0 back at r1, drain w1, w1 back, drain w2.
        order = [
            first(f"{r1}:ready", "roll-w3"),
            first(f"{r0}:draining", "roll-w0"),
            first(f"{r1}:ready", "roll-w0"),
            first(f"{r0}:draining", "roll-w1"),
            first(f"{r1}:ready", "roll-w1"),
            first(f"{r0}:draining", "roll-w2"),
        ]
        assert order == sorted(order), order

        assert status["workers"] == {"desired": 3, "ready": 3, "updated": 3, "available": 3}
        assert [w["name"] for w in status["workerStates"]] == ["roll-w0", "roll-w1", "roll-w3"]
        after = uids(api.pods("roll"))
        for i in (0, 1):  # updated in place: the api and thinker pods stayed, the talker is new
            for role in ("api", "thinker"):
                assert after[f"roll-w{i}-{role}"] == pods_before[f"roll-w{i}-{role}"]
            assert after[f"roll-w{i}-talker"] != pods_before[f"roll-w{i}-talker"]
        talker = next(p for p in api.pods("roll") if p["metadata"]["name"] == "roll-w0-talker")
        assert talker["spec"]["containers"][0]["image"] == TALKER_2["stages"]["talker"]["image"]

        reasons = [
            e["reason"]
            for e in sorted(api.events(), key=lambda e: (e.get("lastTimestamp") or "", e["metadata"]["name"]))
            if e["involvedObject"]["kind"] == "OmniDeployment"
        ]
        rollout_reasons = [r for r in reasons if r in {"WorkerDraining", "WorkerUpdating", "WorkerDeleted"}]
        assert sorted(rollout_reasons) == sorted(
            ["WorkerDraining"] * 3 + ["WorkerUpdating"] * 2 + ["WorkerDeleted"]
        )
        assert "NewRevisionAvailable" in reasons and "RolloutInProgress" in reasons


def test_pause_stops_at_the_next_step_and_resume_finishes(
    crds: ControlPlane, api: Api, namespace: str
) -> None:
    with running_operator(crds, namespace):
        # The pause must land while w0 drains: 4 s leaves room for a slow poll on a loaded machine.
        r0, _ = start(api, "pause", drainTimeoutSeconds=4)
        rec = Recorder(api, "pause", workers=3)
        api.patch_spec("pause", TALKER_2)
        rec.until("w0 draining", lambda st: any(w["state"] == "draining" for w in st.get("workerStates", [])))
        api.patch_spec("pause", {"rollout": {"paused": True}})
        status = rec.until("paused", lambda st: progressing(st) == ("Unknown", "RolloutPaused"))
        r1 = status["updateRevision"]
        # The step under way (w0's drain and update) ends; no other begins.
        rec.until("w0 updated", lambda st: rec.tables[-1].get("pause-w0") == f"{r1}:ready")
        settled = rec.tables[-1]
        deadline = time.monotonic() + 8  # twice the drain timeout
        while time.monotonic() < deadline:
            rec.observe()
            time.sleep(0.2)
        assert rec.tables[-1] == settled
        assert settled == {
            "pause-w0": f"{r1}:ready",
            "pause-w1": f"{r0}:ready",
            "pause-w2": f"{r0}:ready",
            "pause-w3": f"{r1}:ready",
        }
        assert progressing(api.get("pause")["status"]) == ("Unknown", "RolloutPaused")

        api.patch_spec("pause", {"rollout": {"paused": False}})
        rec.until("resumed and complete", complete(r1))
        assert sorted(rec.tables[-1]) == ["pause-w0", "pause-w1", "pause-w3"]
        reasons = {e["reason"] for e in api.events()}
        assert "RolloutPaused" in reasons


def test_progress_deadline_stops_the_rollout_and_a_revert_recovers(
    crds: ControlPlane, api: Api, namespace: str
) -> None:
    with running_operator(crds, namespace):
        r0, pods_before = start(api, "stuck", drainTimeoutSeconds=1, progressDeadlineSeconds=3)
        rec = Recorder(api, "stuck", workers=3)
        # A node selector no node matches: the new worker's GPU pods can never be scheduled.
        api.patch_spec("stuck", {"gpu": {"nodeSelector": {"omni.dev/nowhere": "true"}}})
        status = rec.until(
            "progress deadline exceeded",
            lambda st: progressing(st) == ("False", "ProgressDeadlineExceeded"),
            timeout=30,
        )
        assert condition(status, "Progressing")["message"].startswith("worker stuck-w3 not ready 3 s after")
        # Stopped: no old worker was drained, and none is while the rollout stays stuck.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            rec.observe()
            time.sleep(0.2)
        assert all("draining" not in s for t in rec.tables for s in t.values())
        assert {w: s for w, s in rec.tables[-1].items() if w != "stuck-w3"} == {
            f"stuck-w{i}": f"{r0}:ready" for i in range(3)
        }
        assert rec.tables[-1]["stuck-w3"].endswith(":starting")
        assert any(e["reason"] == "ProgressDeadlineExceeded" for e in api.events())

        api.patch_spec("stuck", {"gpu": {"nodeSelector": {"omni.dev/nowhere": None}}})
        rec.until("reverted", complete(r0), timeout=30)
        assert {n: u for n, u in uids(api.pods("stuck")).items()} == pods_before


def test_revert_mid_rollout_keeps_the_workers_of_the_target_revision(
    crds: ControlPlane, api: Api, namespace: str
) -> None:
    with running_operator(crds, namespace):
        # The revert must land while w0 drains, and w3's drain must fall between polls: 4 s each.
        r0, pods_before = start(api, "revert", drainTimeoutSeconds=4)
        rec = Recorder(api, "revert", workers=3)
        api.patch_spec("revert", TALKER_2)
        rec.until("w0 draining", lambda st: rec.tables[-1].get("revert-w0", "").endswith(":draining"))
        api.patch_spec("revert", TALKER_BACK)
        rec.until("back at the first revision", complete(r0), timeout=60)
        # w0 was taken back into service and the surged worker drained and deleted: no pod of the
        # original workers was replaced.
        assert rec.history("revert-w0") == [f"{r0}:ready", f"{r0}:draining", f"{r0}:ready"]
        surged = rec.history("revert-w3")
        assert surged[-1] == "gone" and surged[-2].endswith(":draining"), surged
        assert uids(api.pods("revert")) == pods_before
        reasons = {e["reason"] for e in api.events()}
        assert {"WorkerRestored", "WorkerDraining", "WorkerDeleted"} <= reasons
