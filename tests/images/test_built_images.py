"""The images `make images` builds, run as real containers with podman: what the rendered pods and
the chart rely on (UID 10001, a read-only root filesystem whose writes all land on the declared
volumes, `omni` as the entry point, the tiny checkpoint written into the runtime's cache volume,
kopf in the operator image). The Dockerfile text is checked in tests/unit/images; this checks the
result. It never skips: a machine that cannot build the images fails here with the build's log.
"""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
IMAGE_REPO = os.environ.get("OMNI_IMAGE_REPO", "ghcr.io/omni-dev")
RUNTIME = f"{IMAGE_REPO}/omni-runtime:{VERSION}-cpu"
OPERATOR = f"{IMAGE_REPO}/omni-operator:{VERSION}"
ENV = {**os.environ, "CONTAINERS_CONF": str(REPO / "images" / "containers.conf")}
# What the Dockerfiles declare (tests/unit/images checks them against the renderer's paths).
VOLUMES = {RUNTIME: ["/tmp", "/var/cache/omni"], OPERATOR: ["/tmp"]}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def built_images() -> None:
    """images/build.sh: cached, so seconds when tests/run.sh (or `make images`) already built them."""
    result = subprocess.run(["bash", "images/build.sh"], cwd=REPO, env=ENV, capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(
            f"images/build.sh failed ({result.returncode}):\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
        )


def podman(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["podman", *args], env=ENV, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        pytest.fail(f"podman {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def run(
    image: str, *args: str, entrypoint: str | None = None, volumes: tuple[str, ...] = (), check: bool = True
):
    """One container the way the pods run it: read-only root, no network, the image's own user."""
    options = ["run", "--rm", "--read-only", "--network", "none", "--no-healthcheck"]
    for volume in volumes:
        options += ["--volume", volume]
    if entrypoint is not None:
        options += ["--entrypoint", entrypoint]
    return podman(*options, image, *args, check=check)


def python(image: str, code: str, **kwargs):
    return run(image, "-c", code, entrypoint="python", **kwargs)


@pytest.fixture
def cache_volume() -> Iterator[str]:
    name = f"omni-test-cache-{uuid.uuid4().hex[:8]}"
    podman("volume", "create", name)
    yield name
    podman("volume", "rm", "--force", name, check=False)


@pytest.mark.parametrize("image", [RUNTIME, OPERATOR])
def test_image_config_runs_omni_as_uid_10001_with_the_declared_volumes(image: str) -> None:
    config = json.loads(podman("image", "inspect", image).stdout)[0]["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["omni"]
    assert sorted(config["Volumes"]) == VOLUMES[image]
    assert "HOME=/tmp" in config["Env"]


@pytest.mark.parametrize("image", [RUNTIME, OPERATOR])
def test_the_process_is_uid_10001_and_not_root(image: str) -> None:
    ids = python(image, "import os; print(os.getuid(), os.getgid(), os.getgroups())").stdout.split(maxsplit=2)
    assert ids[:2] == ["10001", "10001"]
    assert "0" not in ids[2].strip("[]").replace(",", " ").split()


@pytest.mark.parametrize("image", [RUNTIME, OPERATOR])
def test_read_only_root_refuses_writes_and_every_declared_volume_takes_them(image: str) -> None:
    probe = (
        "import errno, sys\n"
        "def write(path):\n"
        "    try:\n"
        "        open(path, 'w').write('x'); return 'ok'\n"
        "    except OSError as e:\n"
        "        return errno.errorcode[e.errno]\n"
        "print(' '.join(write(p) for p in sys.argv[1:]))\n"
    )
    targets = ["/probe", "/opt/omni/venv/probe", *(f"{v}/probe" for v in VOLUMES[image])]
    result = run(image, "-c", probe, *targets, entrypoint="python")
    # EROFS: the root is read-only (not merely unwritable by this user), and the volumes are not.
    assert result.stdout.split() == ["EROFS", "EROFS", *["ok"] * len(VOLUMES[image])]


@pytest.mark.parametrize("image", [RUNTIME, OPERATOR])
def test_omni_help_runs(image: str) -> None:
    result = run(image, "--help")
    for command in ("serve", "stage", "router", "operator", "tiny-checkpoint"):
        assert f"  {command} " in result.stdout


def test_runtime_writes_the_tiny_checkpoint_into_its_cache_volume(cache_volume: str) -> None:
    run(
        RUNTIME,
        "tiny-checkpoint",
        "--quiet",
        "/var/cache/omni/tiny",
        volumes=(f"{cache_volume}:/var/cache/omni",),
    )
    # A second container (as a restarted pod would) finds it on the volume, owned by UID 10001, and
    # the runtime's own loader reads its config back.
    listing = python(
        RUNTIME,
        "import os, json; d = '/var/cache/omni/tiny';"
        "print(json.dumps({f: os.stat(os.path.join(d, f)).st_uid for f in sorted(os.listdir(d))}));"
        "from transformers import AutoConfig; print(AutoConfig.from_pretrained(d).model_type)",
        volumes=(f"{cache_volume}:/var/cache/omni",),
    ).stdout.splitlines()
    owners = json.loads(listing[0])
    assert "config.json" in owners and any(name.endswith(".safetensors") for name in owners)
    assert set(owners.values()) == {10001}
    assert listing[-1] == "qwen2_5_omni"


def test_runtime_has_torch_on_cpu_and_the_media_stack() -> None:
    out = python(
        RUNTIME,
        "import torch, av, soundfile, transformers; print(torch.__version__, torch.cuda.is_available())",
    )
    version, cuda = out.stdout.split()
    assert version.startswith("2.") and cuda == "False"


def test_operator_image_imports_kopf_and_runs_the_operator_command_but_has_no_torch() -> None:
    out = python(
        OPERATOR, "import kopf, kubernetes, omni_operator.main; print(kopf.__version__)"
    ).stdout.strip()
    assert out == _pinned("kopf")
    assert "--liveness-port" in run(OPERATOR, "operator", "--help").stdout
    missing = python(OPERATOR, "import torch", check=False)
    assert missing.returncode == 1 and "No module named 'torch'" in missing.stderr


def _pinned(package: str) -> str:
    for line in (REPO / "images" / "operator-requirements.txt").read_text().splitlines():
        name, _, version = line.split("#")[0].strip().partition("==")
        if name.lower() == package:
            return version
    raise AssertionError(f"{package} is not pinned in images/operator-requirements.txt")
