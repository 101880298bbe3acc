"""Handing a new spec to a running `omni up`: what `Supervisor.apply` accepts and answers, and the
control socket protocol end to end (a real unix socket, no worker processes)."""

from __future__ import annotations

import asyncio
import io
import socket
from pathlib import Path

import pytest

from omni_operator.api.load import SpecError, parse_deployments
from omni_operator.local import control
from omni_operator.local.processes import LocalCapacityError, LocalSettings
from omni_operator.local.rollout import Desired
from omni_operator.local.supervisor import Supervisor
from omni_operator.plan.types import PlanError

BASE = """\
apiVersion: omni.dev/v1alpha1
kind: OmniDeployment
metadata:
  name: demo
spec:
  model:
    name: demo-model
    source:
      type: tiny
    architecture: qwen2_5_omni
  pipeline: text
  workers: 2
  gpu:
    tier: cpu
"""


def edited(extra: str = "", *, workers: int = 2, name: str = "demo") -> str:
    return (
        BASE.replace("workers: 2", f"workers: {workers}").replace("name: demo\n", f"name: {name}\n") + extra
    )


@pytest.fixture
def supervisor(tmp_path: Path) -> Supervisor:
    (dep,) = parse_deployments(BASE)
    settings = LocalSettings(
        base_port=9100, router_port=9000, gpu_offset=0, workers_file=str(tmp_path / "workers.json")
    )
    return Supervisor(dep=dep, settings=settings, state_dir=tmp_path, color=False)


def test_new_revision_starts_a_rollout(supervisor: Supervisor, capsys: pytest.CaptureFixture[str]) -> None:
    before = supervisor.plan.revision
    message = supervisor.apply(
        text=edited("  runtime:\n    extraArgs: [--default-max-tokens, '24']\n"), file="f.yaml"
    )
    after = supervisor.plan.revision
    assert after != before
    assert message == (
        f"rolling workers from revision {before} to {after}: 2 workers, maxSurge 1, maxUnavailable 0"
    )
    assert supervisor.desired() == Desired(revision=after, workers=2)
    assert message in capsys.readouterr().out


def test_same_spec_changes_nothing(supervisor: Supervisor) -> None:
    revision = supervisor.plan.revision
    assert (
        supervisor.apply(text=BASE, file="f.yaml")
        == f"no change to the workers (revision {revision}, 2 workers)"
    )


def test_scaling_and_rollout_settings(supervisor: Supervisor) -> None:
    text = edited("  rollout:\n    paused: true\n    maxSurge: 2\n", workers=3)
    assert (
        supervisor.apply(text=text, file="f.yaml")
        == "scaling from 2 to 3 workers; rollout settings updated (paused)"
    )
    desired = supervisor.desired()
    assert (desired.workers, desired.max_surge, desired.paused) == (3, 2, True)


def test_router_changes_are_reported_not_applied(supervisor: Supervisor) -> None:
    message = supervisor.apply(text=edited("  router:\n    sessionHeader: X-Conversation\n"), file="f.yaml")
    assert message.endswith("; spec.router changed: the router keeps its settings until omni up restarts")


@pytest.mark.parametrize(
    ("text", "error", "expected"),
    [
        ("spec: [", SpecError, "f.yaml:1: malformed YAML"),
        (
            edited(name="other"),
            LocalCapacityError,
            "f.yaml: metadata.name: 'other', but this omni up runs 'demo'",
        ),
        (BASE + "---\n" + BASE, LocalCapacityError, "f.yaml: holds 2 OmniDeployments; give one per file"),
        (
            BASE.replace("tier: cpu", "tier: h100"),
            LocalCapacityError,
            "spec.workers: 2 workers x 1 GPU need 2 GPUs, this machine has 0",
        ),
        (
            edited("  stages:\n    imageEncoder:\n      tensorParallelSize: 2\n").replace(
                "tier: cpu", "tier: h100"
            ),
            PlanError,
            "spec.stages.imageEncoder.tensorParallelSize",
        ),
        (
            BASE.replace(
                "      type: tiny\n", "      type: hostPath\n      hostPath: /nonexistent/checkpoint\n"
            ),
            LocalCapacityError,
            "spec.model.source.hostPath: /nonexistent/checkpoint is not a directory on this machine",
        ),
    ],
    ids=[
        "malformed",
        "other-name",
        "two-documents",
        "too-many-gpus",
        "impossible-placement",
        "no-checkpoint",
    ],
)
def test_refused_specs_change_nothing(
    supervisor: Supervisor, text: str, error: type[Exception], expected: str
) -> None:
    revision, workers = supervisor.plan.revision, supervisor.dep.spec.workers
    with pytest.raises(error) as raised:
        supervisor.apply(text=text, file="f.yaml")
    assert str(raised.value).startswith(expected)
    assert (supervisor.plan.revision, supervisor.dep.spec.workers) == (revision, workers)


async def test_control_socket_round_trip(supervisor: Supervisor, tmp_path: Path) -> None:
    server = control.ControlServer(apply=supervisor.apply, refused=(SpecError, PlanError, LocalCapacityError))
    await server.listen(tmp_path)
    try:
        assert control.connect(tmp_path / "elsewhere") is None
        with pytest.raises(control.ControlError, match="another omni up already runs"):
            control.prepare_listen_path(tmp_path)

        out = io.StringIO()
        sock = control.connect(tmp_path)
        assert sock is not None
        code = await asyncio.to_thread(
            control.hand_over, sock, file="f.yaml", text=edited(workers=3), follow=False, out=out
        )
        assert (code, out.getvalue()) == (0, "omni up: scaling from 2 to 3 workers\n")
        assert supervisor.dep.spec.workers == 3

        sock = control.connect(tmp_path)
        assert sock is not None
        code = await asyncio.to_thread(
            control.hand_over, sock, file="f.yaml", text="spec: [", follow=False, out=out
        )
        assert code == 2
    finally:
        server.close()
        server.remove()
    assert not control.socket_path(tmp_path).exists()


def test_stale_socket_is_removed(tmp_path: Path) -> None:
    path = control.socket_path(tmp_path)
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(path))  # bound, never listening: what a killed instance leaves behind
    assert control.connect(tmp_path) is None
    assert not path.exists()


def test_long_state_dir_is_a_clear_error(tmp_path: Path) -> None:
    long = tmp_path / ("x" * 120)
    with pytest.raises(control.ControlError, match="pick a shorter --state-dir"):
        control.check_socket_path(long)
