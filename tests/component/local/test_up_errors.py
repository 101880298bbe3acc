"""`omni up` refuses bad input with one clear line on stderr and exit code 2, before starting
anything: no traceback, no process left, no worker table written."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from up_harness import OMNI, REPO, free_base_port, free_port, text_spec

MALFORMED = "apiVersion: omni.dev/v1alpha1\nkind: OmniDeployment\nspec: [\n"
IMPOSSIBLE = text_spec().replace(
    "  gpu:\n    tier: cpu\n",
    "  gpu:\n    tier: h100\n  stages:\n    imageEncoder:\n      tensorParallelSize: 2\n",
)
TOO_MANY_GPUS = text_spec(workers=64).replace("tier: cpu", "tier: h100")
UNKNOWN_FIELD = text_spec().replace("  pipeline: text\n", "  pipeline: text\n  replicas: 3\n")
# Checkpoints omni up cannot find on this machine (it would otherwise restart the workers forever).
TINY_SOURCE = "    source:\n      type: tiny\n"
PVC = text_spec().replace(TINY_SOURCE, "    source:\n      type: pvc\n      claimName: models\n")
IMAGE = text_spec().replace(TINY_SOURCE, "    path: /nonexistent/omni-checkpoint\n")
NO_DIRECTORY = text_spec(checkpoint=Path("/nonexistent/omni-checkpoint"))
NO_CONFIG = text_spec(checkpoint=REPO / "examples")


def run_up(tmp_path: Path, *args: str, spec: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = [str(OMNI), "up", "--state-dir", str(tmp_path / "state"), *args]
    if spec is not None:
        (tmp_path / "dep.yaml").write_text(spec)
        argv += ["-f", str(tmp_path / "dep.yaml")]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO, check=False)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (MALFORMED, "dep.yaml:4: malformed YAML: expected the node content"),
        (UNKNOWN_FIELD, "dep.yaml: spec.replicas: unknown field"),
        (
            IMPOSSIBLE,
            "spec.stages.imageEncoder.tensorParallelSize: with placement withThinker the vision encoder "
            "shares the thinker's GPUs",
        ),
        (TOO_MANY_GPUS, "spec.workers: 64 workers x 1 GPU need 64 GPUs, this machine has"),
        (
            PVC,
            "spec.model.source.type: pvc names a PersistentVolumeClaim, which only a cluster has; under omni up "
            "use type hostPath with hostPath set to the checkpoint directory on this machine",
        ),
        (
            IMAGE,
            "spec.model.path: /nonexistent/omni-checkpoint is not a directory on this machine; with source "
            "type image omni up reads the checkpoint there on this machine: set spec.model.path to the checkpoint "
            "directory, or use source type hostPath with hostPath set to it",
        ),
        (
            NO_DIRECTORY,
            "spec.model.source.hostPath: /nonexistent/omni-checkpoint is not a directory on this machine; "
            "point it at the checkpoint directory (omni up runs every stage on this machine)",
        ),
        (
            NO_CONFIG,
            f"spec.model.source.hostPath: {REPO / 'examples'} has no config.json; point it at the "
            "checkpoint directory",
        ),
    ],
    ids=[
        "malformed-yaml",
        "unknown-field",
        "impossible-placement",
        "more-gpus-than-the-machine",
        "pvc-source",
        "image-path-missing",
        "host-path-missing",
        "host-path-without-config",
    ],
)
def test_bad_spec_is_one_line_and_exit_2(tmp_path: Path, spec: str, expected: str) -> None:
    result = run_up(tmp_path, "--port", str(free_port()), spec=spec)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("omni up: error: ")
    assert expected in lines[0]
    assert not (tmp_path / "state" / "workers.json").exists()
    assert not (tmp_path / "state" / "control.sock").exists()


def test_missing_file(tmp_path: Path) -> None:
    result = run_up(tmp_path, "-f", str(tmp_path / "nope.yaml"))
    assert (result.returncode, result.stderr) == (
        2,
        f"omni up: error: {tmp_path / 'nope.yaml'}: file not found; check the path\n",
    )


def test_router_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        result = run_up(tmp_path, "--port", str(port), "--base-port", str(free_base_port()), spec=text_spec())
    assert (result.returncode, result.stderr) == (
        2,
        f"omni up: error: --port {port}: another process listens there; pick a free --port\n",
    )


def test_state_dir_too_long_for_the_control_socket(tmp_path: Path) -> None:
    long = tmp_path / ("d" * 110)
    result = run_up(tmp_path, "--state-dir", str(long), spec=text_spec())
    assert result.returncode == 2
    assert result.stderr.startswith(f"omni up: error: --state-dir {long}: too long for the control socket")
    assert result.stderr.rstrip().endswith("pick a shorter --state-dir")
