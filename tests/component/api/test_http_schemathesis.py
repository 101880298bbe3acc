"""A bounded schemathesis pass against a real `omni serve` process's /openapi.json.

Schemathesis (a dev dependency) generates requests from the document: a few examples per
operation, a time budget, one worker. Every answer must be documented for its route (status and
content type) and none may be a 5xx. Text pipeline, so generated requests stay quick on a CPU.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from served_worker import Served, serve

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
BUDGET_S = 75


@pytest.fixture(scope="module")
def served(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(tiny_checkpoint, tmp_path_factory.mktemp("schemathesis")) as worker:
        yield worker


@pytest.mark.timeout(BUDGET_S + 90)
def test_schemathesis_finds_no_server_error_and_no_undocumented_answer(
    served: Served, tmp_path: Path
) -> None:
    if not SCHEMATHESIS.exists():
        pytest.skip("schemathesis is not installed (pip install -e '.[dev]')")
    command = [
        str(SCHEMATHESIS), "run", f"{served.url}/openapi.json",
        "--checks", "not_a_server_error,status_code_conformance,content_type_conformance",
        "--phases", "examples,coverage,fuzzing",
        "--max-examples", "4",
        "--max-time", str(BUDGET_S),
        "--workers", "1",
        "--request-timeout", "30",
        "--generation-deterministic",
        "--suppress-health-check", "all",
    ]  # fmt: skip
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=BUDGET_S + 60,
        cwd=tmp_path,
        env={"NO_COLOR": "1", "PATH": ""},
    )
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    assert served.process.poll() is None, served.output()
