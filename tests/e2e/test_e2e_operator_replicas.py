"""Operator replicas: a restart in the middle of a reconcile resumes without duplicates, and of two
replicas (kopf peering) exactly one acts until it dies and the other takes over."""

from __future__ import annotations

import time

import pytest
from e2e_cluster import ControlPlane, wait_for
from e2e_operator import Api, OperatorProcess, deployment

pytestmark = pytest.mark.e2e

FAST_PEERING = ("--peering-lifetime", "6")


def test_restart_mid_reconcile_resumes_without_duplicates(
    crds: ControlPlane, api: Api, namespace: str
) -> None:
    api.create(deployment("resume", workers=8))
    first = OperatorProcess(crds, namespace, name="first", args=FAST_PEERING)
    try:
        # Poll without pause: SIGKILL within milliseconds of the first pod, mid-way through the
        # ~60 applies of the first reconcile.
        deadline = time.monotonic() + 60
        while not api.pods("resume"):
            assert time.monotonic() < deadline, f"no pod created:\n{first.log()[-2000:]}"
        first.kill()
    finally:
        first.stop()
    created = len(api.pods("resume"))
    assert created < 24, "the first operator finished before it was killed: nothing resumed"

    second = OperatorProcess(crds, namespace, name="second", args=FAST_PEERING).wait_live()
    try:
        api.wait_ready("resume", 8, timeout=120)
    finally:
        second.stop()
    pods = api.pods("resume")
    names = [p["metadata"]["name"] for p in pods]
    assert sorted(names) == sorted(f"resume-w{i}-{r}" for i in range(8) for r in ("api", "thinker", "talker"))
    assert all(len(p["metadata"]["ownerReferences"]) == 1 for p in pods)
    services = sorted(s["metadata"]["name"] for s in api.services("resume"))
    assert services == ["resume", *(f"resume-w{i}" for i in range(8))]
    assert "AlreadyExists" not in second.log()


def test_two_replicas_one_active_then_failover(crds: ControlPlane, api: Api, namespace: str) -> None:
    leader = OperatorProcess(crds, namespace, name="a", args=FAST_PEERING).wait_live()
    standby = OperatorProcess(crds, namespace, name="b", args=FAST_PEERING).wait_live()
    try:
        # Both replicas announce themselves in the peering object; b starts paused (a has the higher
        # priority: it started first) and stays so while a keeps its record alive.
        peering = f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings/omni-operator"
        wait_for(
            "both replicas in the peering",
            lambda: len(api.client.get(peering).json().get("status", {})) == 2,
            timeout=60,
        )
        assert "Resuming operations" in leader.log()
        api.create(deployment("ha", workers=1))
        api.wait_ready("ha", 1)
        assert leader.reconcile_lines("ha")
        assert standby.reconcile_lines("ha") == []
        assert "Resuming operations" not in standby.log()

        leader.kill()
        wait_for("b resumes", lambda: "Resuming operations" in standby.log(), timeout=60)
        api.patch_spec("ha", {"workers": 2})
        api.wait_ready("ha", 2)
        assert standby.reconcile_lines("ha")
    finally:
        leader.stop()
        standby.stop()
