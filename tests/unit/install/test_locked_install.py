"""The test environment is the locked one: `make setup` installs uv.lock's versions, and the lower
bounds of the model stack in pyproject.toml are versions the suite runs on.

(transformers 5.17, allowed by an older `>=5.0`, broke thinker tensor parallelism: its Qwen2.5
tensor-parallel plan names a sharding style the runtime does not implement.)
"""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCK = tomllib.loads((ROOT / "uv.lock").read_text())
LOCKED: dict[str, set[str]] = {}  # name -> locked versions (one per Python-version fork)
for _package in LOCK["package"]:
    if "version" in _package:
        LOCKED.setdefault(_package["name"], set()).add(_package["version"])
MODEL_STACK = ("torch", "transformers")


def _requirements() -> dict[str, str]:
    """name -> specifier, of the runtime dependencies and the dev extra."""
    out = {}
    deps = PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["dev"]
    for dep in deps:
        match = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?(.*)$", dep)
        assert match, dep
        out[match.group(1).lower().replace("_", "-")] = match.group(3).strip()
    return out


def _base(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def test_every_dependency_is_locked_and_installed_at_its_locked_version() -> None:
    mismatched = {}
    for name in _requirements():
        assert name in LOCKED, f"{name} is not in uv.lock: run `uv lock`"
        try:
            installed = version(name)
        except PackageNotFoundError:
            pytest.fail(f"{name} is locked but not installed: run `make setup`")
        if _base(installed) not in {_base(v) for v in LOCKED[name]}:
            mismatched[name] = (installed, sorted(LOCKED[name]))
    assert mismatched == {}, "installed != uv.lock: run `make setup`"


@pytest.mark.parametrize("name", MODEL_STACK)
def test_the_model_stack_lower_bound_is_the_tested_version(name: str) -> None:
    spec = _requirements()[name]
    lower = re.search(r">=\s*([0-9.]+)", spec)
    upper = re.search(r"<\s*([0-9.]+)", spec)
    assert lower and upper, f"{name}: give both bounds, e.g. >=X.Y,<N (got {spec!r})"
    (locked,) = LOCKED[name]
    assert _base(lower.group(1)) == _base(locked)[: len(_base(lower.group(1)))], (
        f"{name}: the lower bound {lower.group(1)} is not the locked, tested {locked}"
    )


def test_the_runtime_image_installs_the_locked_torch() -> None:
    dockerfile = (ROOT / "images" / "runtime.Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (TORCH_VERSION|TORCHVISION_VERSION)=(\S+)$", dockerfile, re.M))
    assert args == {
        "TORCH_VERSION": next(iter(LOCKED["torch"])),
        "TORCHVISION_VERSION": next(iter(LOCKED["torchvision"])),
    }
    assert len(LOCKED["torch"]) == len(LOCKED["torchvision"]) == 1
