"""The router's Kubernetes source on the real control plane, with the operator it works beside.

`omni router --source kubernetes` runs as a subprocess (the command its pod runs) against the test
API server: it must list and watch the worker Services the operator publishes, and write its
live-session report on a draining worker's Service so the operator ends the drain without waiting
for drainTimeoutSeconds. kwok pods serve no HTTP, so no worker ever passes the router's /ready
check: the test asserts the router's table, not proxying.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_cluster import ControlPlane, die_with_parent, free_port, wait_for
from e2e_operator import Api, OperatorProcess, running_operator

from omni_operator.api import labels

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NAME = "tiny"
REPLICA = "router-test"
REPORT_KEY = f"live-sessions.omni.dev/{REPLICA}"
DRAIN_TIMEOUT = 600  # a drain that waited for its timeout would fail the test by minutes


def tiny_deployment() -> dict[str, Any]:
    body = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    body["metadata"] = {"name": NAME}
    body["spec"]["rollout"] = {"drainTimeoutSeconds": DRAIN_TIMEOUT}
    body["spec"]["router"] = {"replicas": 1}  # the operator waits for this many reports
    return body


class RouterProcess:
    """`omni router --source kubernetes` with the test kubeconfig and POD_NAME=router-test."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.port = free_port()
        self.log_path = cp.workdir / "logs" / f"{namespace}-router.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "omni_operator.cli",
            "router",
            "--source",
            "kubernetes",
            "--namespace",
            namespace,
            "--deployment",
            NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--connect-timeout",
            "1",
        ]
        env = {**os.environ, "KUBECONFIG": str(cp.kubeconfig), "POD_NAME": REPLICA, "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=die_with_parent(os.getpid()),  # a killed pytest takes it along
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def workers(self) -> dict[str, dict[str, Any]]:
        if self.proc.poll() is not None:
            raise AssertionError(f"router exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
        r = httpx.get(f"http://127.0.0.1:{self.port}/admin/workers", timeout=5)
        r.raise_for_status()
        return {w["id"]: w for w in r.json()["workers"]}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def router(crds: ControlPlane, namespace: str) -> Iterator[RouterProcess]:
    proc = RouterProcess(crds, namespace)
    try:
        yield proc
    finally:
        proc.stop()


def worker_services(api: Api) -> dict[str, dict[str, Any]]:
    return {
        s["metadata"]["name"]: s
        for s in api.services(NAME)
        if s["metadata"]["labels"].get(labels.COMPONENT) == "worker"
    }


def expected_table(api: Api) -> dict[str, tuple[str, str, str]]:
    """What the router should hold: worker -> (url, revision, state), read from the Services."""
    out = {}
    for s in worker_services(api).values():
        meta = s["metadata"]
        annotations = meta.get("annotations") or {}
        out[meta["labels"][labels.WORKER]] = (
            annotations[labels.API_URL],
            meta["labels"][labels.REVISION],
            annotations.get(labels.WORKER_STATE, "ready"),
        )
    return out


def router_table(router: RouterProcess) -> dict[str, tuple[str, str, str]]:
    return {w: (e["url"], e["revision"], e["state"]) for w, e in router.workers().items()}


def tables_agree(api: Api, router: RouterProcess) -> bool:
    return router_table(router) == expected_table(api)


def annotate(api: Api, service: str, annotations: dict[str, str | None]) -> None:
    r = api.client.patch(
        f"/api/v1/namespaces/{api.ns}/services/{service}",
        json={"metadata": {"annotations": annotations}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert r.status_code == 200, r.text


def report(api: Api, service: str) -> dict[str, Any] | None:
    annotations = worker_services(api).get(service, {}).get("metadata", {}).get("annotations") or {}
    value = annotations.get(REPORT_KEY)
    return json.loads(value) if value else None


def rollout_reports(router: RouterProcess, *, hand_made: str) -> dict[str, dict[str, list[Any]]]:
    """Reports the router logged, by Service: the drain values and counts, in order."""
    out: dict[str, dict[str, list[Any]]] = {}
    for line in router.log().splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        if entry.get("event") != "drain_report" or entry["drain"] == hand_made:
            continue
        seen = out.setdefault(entry["service"], {"drain": [], "sessions": []})
        seen["drain"].append(entry["drain"])
        seen["sessions"].append(entry["sessions"])
    return out


def test_router_follows_services_and_reports_drains(
    crds: ControlPlane, api: Api, namespace: str, router: RouterProcess
) -> None:
    op = OperatorProcess(crds, namespace).wait_live()
    try:
        api.create(tiny_deployment())
        r0 = api.wait_ready(NAME, 2)["updateRevision"]
        wait_for("router table = worker Services", lambda: tables_agree(api, router), timeout=20)
        table = router.workers()
        assert sorted(table) == [f"{NAME}-w0", f"{NAME}-w1"]
        assert {(e["revision"], e["state"], e["healthy"]) for e in table.values()} == {(r0, "ready", False)}
    finally:
        op.stop()  # while stopped, the operator does not undo the hand-made drain below

    # A drain by hand: the router drops the worker from rotation and reports its 0 sessions.
    drain = "2026-01-01T00:00:00Z"
    annotate(api, f"{NAME}-w1", {labels.WORKER_STATE: "draining", labels.DRAIN_STARTED: drain})
    wait_for(
        "router sees the drain", lambda: router.workers()[f"{NAME}-w1"]["state"] == "draining", timeout=10
    )
    wait_for("router reports the drain", lambda: report(api, f"{NAME}-w1") is not None, timeout=10)
    assert report(api, f"{NAME}-w1") == {"drain": drain, "sessions": 0}
    assert report(api, f"{NAME}-w0") is None  # a serving worker gets no report
    annotate(api, f"{NAME}-w1", {labels.WORKER_STATE: "ready", labels.DRAIN_STARTED: None, REPORT_KEY: None})

    # A real rollout: each drain ends on the router's report, long before drainTimeoutSeconds.
    with running_operator(crds, namespace):
        wait_for("router table = worker Services", lambda: tables_agree(api, router), timeout=20)
        started = time.monotonic()
        api.patch_spec(NAME, {"stages": {"talker": {"image": "ghcr.io/omni/runtime:talker-2"}}})
        drains: dict[str, str] = {}  # worker -> drain-started value the operator wrote (as polled)
        deadline = started + 90
        while True:
            for svc_name, s in worker_services(api).items():
                annotations = s["metadata"].get("annotations") or {}
                if annotations.get(labels.DRAIN_STARTED):
                    drains.setdefault(svc_name, annotations[labels.DRAIN_STARTED])
            body = api.get(NAME) or {}
            status = body.get("status") or {}
            r1 = status.get("updateRevision")
            progressing = next((c for c in status.get("conditions", []) if c["type"] == "Progressing"), {})
            if (
                r1 != r0
                and status.get("currentRevision") == r1
                and progressing.get("reason") == "NewRevisionAvailable"
                and [w["state"] for w in status.get("workerStates", [])] == ["ready", "ready"]
            ):
                break
            assert time.monotonic() < deadline, f"rollout not done; status: {status}\n{router.log()[-2000:]}"
            time.sleep(0.1)
        elapsed = time.monotonic() - started
        # The operator may end a drain and clean the Service up between two polls, so the reports
        # are read from the router's own log (one JSON line per report written).
        wait_for(
            "report lines flushed", lambda: len(rollout_reports(router, hand_made=drain)) >= 2, timeout=5
        )
        reports = rollout_reports(router, hand_made=drain)
        print(f"\nrollout of 2 workers took {elapsed:.1f} s; drains seen {drains}; reports {reports}")
        assert elapsed < 60, elapsed  # two drains waiting out their timeout would take 1200 s
        # Both old workers were drained (w0 updated in place, w1 removed), each reported empty once.
        assert sorted(reports) == [f"{NAME}-w0", f"{NAME}-w1"], reports
        assert all(r["sessions"] == [0] for r in reports.values()), reports
        for worker, value in drains.items():
            assert reports[worker]["drain"] == [value], (worker, drains, reports)
        wait_for("router table = new Services", lambda: tables_agree(api, router), timeout=20)
        assert {e["revision"] for e in router.workers().values()} == {r1}
