"""`omni render`, `omni plan` and `omni crd` through the real console script, error paths included."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
OMNI = ROOT / ".venv" / "bin" / "omni"
TINY = ROOT / "examples" / "tiny-cpu.yaml"


@pytest.fixture(autouse=True)
def _console_script() -> None:
    """These tests run the real console script: a missing one fails them (never a skip)."""
    assert OMNI.exists(), f"{OMNI} is missing: `make setup` installs it"


def omni(*args: str, cwd: Path = ROOT, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(OMNI), *args], cwd=cwd, input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


def assert_clean_error(result: subprocess.CompletedProcess[str], code: int, message: str) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stdout == ""
    assert result.stderr.strip() == message
    assert len(result.stderr.strip().splitlines()) == 1


def test_render_prints_yaml_documents_like_helm_template() -> None:
    result = omni("render", "-f", str(TINY))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("---\n")
    docs = list(yaml.safe_load_all(result.stdout))
    assert [(d["kind"], d["metadata"]["name"]) for d in docs][-3:] == [
        ("Service", "tiny-omni-w1"),
        ("NetworkPolicy", "tiny-omni-w1"),
        ("Pod", "tiny-omni-w1-worker"),
    ]
    assert "&id" not in result.stdout  # no YAML anchors in manifests people read


def test_render_json_with_namespace() -> None:
    result = omni("render", "-f", str(TINY), "-n", "omni-demo", "-o", "json")
    assert result.returncode == 0, result.stderr
    listing = json.loads(result.stdout)
    assert listing["kind"] == "List"
    assert {item["metadata"]["namespace"] for item in listing["items"]} == {"omni-demo"}
    pod = next(i for i in listing["items"] if i["kind"] == "Pod")
    assert pod["spec"]["subdomain"] == "tiny-omni-w0"


def test_render_reads_stdin() -> None:
    result = omni("render", "-f", "-", stdin=TINY.read_text())
    assert result.returncode == 0, result.stderr
    assert len(list(yaml.safe_load_all(result.stdout))) == 13


def test_render_missing_file() -> None:
    assert_clean_error(
        omni("render", "-f", "nope.yaml"), 2, "omni render: error: nope.yaml: file not found; check the path"
    )


def test_render_malformed_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: omni.dev/v1alpha1\nkind: OmniDeployment\nspec:\n  model: {name: x\n")
    assert_clean_error(
        omni("render", "-f", str(bad)),
        2,
        f"omni render: error: {bad}:5: malformed YAML: expected ',' or '}}', but got '<stream end>'; "
        "fix the YAML syntax on that line",
    )


def test_render_unknown_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY.read_text().replace("  workers: 2\n", "  worker: 2\n"))
    assert_clean_error(
        omni("render", "-f", str(bad)),
        2,
        f"omni render: error: {bad}: spec.worker: unknown field 'worker'; did you mean workers? fields of spec: "
        "model, runtime, pipeline, workers, stages, gpu, router, rollout, media, streamingInput, speech, sessionKv",
    )


def test_render_wrong_type(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY.read_text().replace("  workers: 2\n", "  workers: two\n"))
    assert_clean_error(
        omni("render", "-f", str(bad)),
        2,
        f"omni render: error: {bad}: spec.workers: expected a whole number, got 'two'; set workers to a whole number",
    )


def test_render_impossible_placement(tmp_path: Path) -> None:
    bad = tmp_path / "ming.yaml"
    source = (ROOT / "examples" / "ming-flash-omni-speech-h100.yaml").read_text()
    bad.write_text(source.replace("tensorParallelSize: 4", "tensorParallelSize: 2"))
    assert_clean_error(
        omni("render", "-f", str(bad)),
        2,
        f"omni render: error: {bad}: spec.stages.thinker.tensorParallelSize: the ming_omni thinker does not fit: "
        "103B params x 2 bytes/param (bf16) = 206.0 GB, / tensorParallelSize 2 = 103.0 GB per GPU > 0.80 x 80 GB = "
        "64.0 GB usable on h100; set tensorParallelSize: 4 (51.5 GB per GPU)",
    )


def test_render_needs_a_file() -> None:
    result = omni("render")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "the following arguments are required: -f/--filename" in result.stderr


def test_plan_prints_the_plan() -> None:
    result = omni("plan", "-f", str(TINY))
    assert result.returncode == 0, result.stderr
    (plan,) = yaml.safe_load_all(result.stdout)
    assert plan["deployment"] == "tiny-omni"
    assert [w["api_url"] for w in plan["workers"]] == [
        "http://worker.tiny-omni-w0.default.svc.cluster.local:8000",
        "http://worker.tiny-omni-w1.default.svc.cluster.local:8000",
    ]


def test_plan_local_target() -> None:
    result = omni("plan", "-f", str(TINY), "--target", "local")
    assert result.returncode == 0, result.stderr
    (plan,) = yaml.safe_load_all(result.stdout)
    assert plan["target"] == "local"
    assert [w["api_url"] for w in plan["workers"]] == ["http://127.0.0.1:8101", "http://127.0.0.1:8111"]


def test_plan_error_path(tmp_path: Path) -> None:
    bad = tmp_path / "text.yaml"
    doc = yaml.safe_load(TINY.read_text())
    doc["spec"]["pipeline"] = "text"
    doc["spec"]["stages"]["talker"] = {"enabled": True}
    bad.write_text(yaml.safe_dump(doc))
    assert_clean_error(
        omni("plan", "-f", str(bad)),
        2,
        f"omni plan: error: {bad}: spec.stages.talker.enabled: the text pipeline launches no talker; use pipeline: "
        "speech, or remove stages.talker.enabled",
    )


def test_crd_prints_the_generated_crd() -> None:
    result = omni("crd")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (ROOT / "crds" / "omni.dev_omnideployments.yaml").read_text()


def test_crd_writes_then_checks(tmp_path: Path) -> None:
    out = tmp_path / "crds"
    written = omni("crd", "-o", str(out))
    assert written.returncode == 0, written.stderr
    assert written.stdout.strip() == f"wrote {out / 'omni.dev_omnideployments.yaml'}"
    fresh = omni("crd", "--check", "-o", str(out))
    assert fresh.returncode == 0, fresh.stderr
    target = out / "omni.dev_omnideployments.yaml"
    target.write_text(target.read_text().replace("Workers", "Replicas"))
    assert_clean_error(
        omni("crd", "--check", "-o", str(out)),
        1,
        f"omni crd: {target} is stale; regenerate it with `omni crd -o {out}`",
    )


def test_crd_check_default_dir_and_missing(tmp_path: Path) -> None:
    assert omni("crd", "--check").returncode == 0  # the repository's crds/ is fresh
    assert_clean_error(
        omni("crd", "--check", cwd=tmp_path),
        1,
        "omni crd: crds/omni.dev_omnideployments.yaml is missing; regenerate it with `omni crd -o crds`",
    )


def test_crd_unwritable_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = omni("crd", "-o", str(blocker / "crds"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(
        f"omni crd: error: cannot write {blocker / 'crds' / 'omni.dev_omnideployments.yaml'}: "
    )
