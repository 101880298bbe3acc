"""The released peer runtimes, installed once per machine outside the repo and outside the venv.

`pip install --no-deps --target ~/.cache/omni/peers/<name>-<version>`: the wheels' own code only
(their dependencies are the engines this suite never runs; peer_shim.py stands in for the few
the parsing code imports). vllm-omni's deploy-config loader needs OmegaConf, which goes into the
same directory. Without network on the first run the install fails, and so do these tests.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
SGLANG_OMNI = ("sglang-omni", "0.1.9", ())
VLLM_OMNI = ("vllm-omni", "0.30.0", ("omegaconf==2.3.0", "antlr4-python3-runtime==4.9.3"))


def install(name: str, version: str, extra: tuple[str, ...]) -> Path:
    root = Path(os.environ.get("OMNI_CACHE_DIR", Path.home() / ".cache" / "omni")) / "peers"
    target = root / f"{name}-{version}"
    if (target / ".complete").exists():
        return target
    partial = root / f".{name}-{version}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    packages = ["--no-deps", "--target", str(partial), f"{name}=={version}", *extra]
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if importlib.util.find_spec("pip") is not None:
        command = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *packages,
        ]
    else:  # a venv made by `uv sync` has no pip
        command = [uv, "pip", "install", "--quiet", "--python", sys.executable, *packages]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(
            f"could not install {name}=={version} into {partial}:\n{done.stdout}\n{done.stderr}",
            pytrace=False,
        )
    (partial / ".complete").touch()
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


def run_checker(runtime: str, site: str, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """All cases of one runtime in one checker subprocess (peer_check.py): its stubs stay there."""
    job = json.dumps({"runtime": runtime, "site": site, "cases": cases})
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    done = subprocess.run(
        [sys.executable, str(HERE / "peer_check.py")], input=job, capture_output=True, text=True, env=env
    )
    if done.returncode != 0 or not done.stdout.strip():
        pytest.fail(f"{runtime} checker failed:\n{done.stderr[-4000:]}", pytrace=False)
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(results) == len(cases)
    return results
