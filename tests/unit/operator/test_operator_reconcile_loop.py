"""reconcile_loop: a pass that raises anything is logged, retried with the capped backoff, and (when
it is not an API error) reported on the OmniDeployment's status, best effort."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from omni_operator import handlers, k8s
from omni_operator.reconcile.decide import Decision

BODY = {
    "apiVersion": "omni.dev/v1alpha1",
    "kind": "OmniDeployment",
    "metadata": {"name": "qwen", "namespace": "ns", "uid": "uid-1", "generation": 1},
    "spec": {},
}
API_ERROR = k8s.KubeError(500, "GET", "/api/v1/namespaces/ns/pods", '{"message": "etcd timeout"}')


class Stopped:
    """Stands for kopf.DaemonStopped: false until the script runs out."""

    def __init__(self) -> None:
        self.set = False

    def __bool__(self) -> bool:
        return self.set


@dataclass
class FakeKube:
    """Records what the loop writes; `fail_writes` makes every write raise it."""

    fail_writes: Exception | None = None
    written: list[Decision] = field(default_factory=list)

    def scoped(self) -> FakeKube:
        return self

    def carry_out(self, decision: Decision, *, body: dict[str, Any]) -> None:
        if self.fail_writes is not None:
            raise self.fail_writes
        self.written.append(decision)


async def run_loop(monkeypatch: pytest.MonkeyPatch, passes: list[Exception | None], kube: FakeKube) -> None:
    """Runs reconcile_loop until every scripted pass ran (None: a pass that succeeds)."""
    stopped = Stopped()
    script = list(passes)

    def reconcile_once(_kube: Any, body: dict, _static: Any) -> float | None:
        outcome = script.pop(0)
        stopped.set = not script
        if outcome is not None:
            raise outcome
        return None

    monkeypatch.setattr(handlers, "reconcile_once", reconcile_once)
    await handlers.reconcile_loop(
        body=BODY,
        namespace="ns",
        name="qwen",
        stopped=stopped,
        memo=SimpleNamespace(kube=kube),
    )


def ready_conditions(kube: FakeKube) -> list[tuple[str, str, str]]:
    out = []
    for decision in kube.written:
        assert decision.status is not None
        ready = decision.status["conditions"][0]
        out.append((ready["status"], ready["reason"], ready["message"]))
    return out


@pytest.mark.parametrize(
    ("failures", "delay"), [(1, 2.0), (2, 4.0), (3, 8.0), (5, 32.0), (6, 60.0), (40, 60.0)]
)
def test_retry_delay_doubles_up_to_a_minute(failures: int, delay: float) -> None:
    assert handlers.retry_delay(failures) == delay


@pytest.mark.parametrize(
    ("passes", "asked", "logged", "reported"),
    [
        pytest.param(
            [ValueError("bad port"), None],
            [1],
            [("ERROR", "reconcile ns/qwen raised (retry in 0 s)", ValueError)],
            [("False", "ReconcileError", "ValueError: bad port")],
            id="a bug once, then a good pass",
        ),
        pytest.param(
            [API_ERROR, KeyError("talker"), ValueError("bad port"), None],
            [1, 2, 3],
            [
                (
                    "WARNING",
                    "reconcile ns/qwen failed (retry in 0 s): GET /api/v1/namespaces/ns/pods: 500 etcd timeout",
                    None,
                ),
                ("ERROR", "reconcile ns/qwen raised (retry in 0 s)", KeyError),
                ("ERROR", "reconcile ns/qwen raised (retry in 0 s)", ValueError),
            ],
            [
                ("False", "ReconcileError", "KeyError: 'talker'"),
                ("False", "ReconcileError", "ValueError: bad port"),
            ],
            id="API errors and bugs share one backoff; only bugs go on the status",
        ),
        pytest.param(
            [ValueError("bad port"), None, ValueError("bad port"), None],
            [1, 1],
            [
                ("ERROR", "reconcile ns/qwen raised (retry in 0 s)", ValueError),
                ("ERROR", "reconcile ns/qwen raised (retry in 0 s)", ValueError),
            ],
            [
                ("False", "ReconcileError", "ValueError: bad port"),
                ("False", "ReconcileError", "ValueError: bad port"),
            ],
            id="a good pass resets the backoff",
        ),
    ],
)
async def test_a_failed_pass_is_logged_retried_and_reported(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    quick_loop: list[int],
    passes: list[Exception | None],
    asked: list[int],
    logged: list[tuple[str, str, type | None]],
    reported: list[tuple[str, str, str]],
) -> None:
    kube = FakeKube()
    with caplog.at_level(logging.INFO, logger="omni.operator"):
        await run_loop(monkeypatch, passes, kube)
    assert quick_loop == asked
    assert [
        (r.levelname, r.getMessage(), r.exc_info[0] if r.exc_info else None) for r in caplog.records
    ] == logged
    assert ready_conditions(kube) == reported


@pytest.mark.parametrize(
    ("write_error", "warning"),
    [
        (
            k8s.KubeError(403, "PATCH", "/apis/omni.dev/v1alpha1/x/status", '{"message": "forbidden"}'),
            "reconcile ns/qwen: status not written: PATCH /apis/omni.dev/v1alpha1/x/status: 403 forbidden",
        ),
        (
            ConnectionRefusedError("connection refused"),
            "reconcile ns/qwen: status not written: connection refused",
        ),
    ],
)
async def test_a_status_that_cannot_be_written_does_not_stop_the_loop(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    quick_loop: list[int],
    write_error: Exception,
    warning: str,
) -> None:
    kube = FakeKube(fail_writes=write_error)
    with caplog.at_level(logging.INFO, logger="omni.operator"):
        await run_loop(monkeypatch, [ValueError("bad port"), ValueError("bad port"), None], kube)
    assert quick_loop == [1, 2]
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("ERROR", "reconcile ns/qwen raised (retry in 0 s)"),
        ("WARNING", warning),
        ("ERROR", "reconcile ns/qwen raised (retry in 0 s)"),
        ("WARNING", warning),
    ]
