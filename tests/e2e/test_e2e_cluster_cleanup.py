"""`python tests/e2e/e2e_cluster.py` leaves no process behind, however it is stopped.

SIGTERM and Ctrl-C unwind its cleanup (every component stopped, etcd last); a SIGKILL gives it no
chance, so each component also dies with its parent (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_cluster import BINARIES, bin_dir, missing_binaries

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]
SCRIPT = Path(__file__).resolve().parent / "e2e_cluster.py"
COMPONENTS = {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}


def _descendants(root: int) -> dict[int, str]:
    """pid -> command name of every live process below ``root``."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            parents[int(entry.name)], names[int(entry.name)] = int(fields[1]), Path(argv0).name
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found[child] = names[child]
                frontier.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize(
    ("sig", "settle"),
    [(signal.SIGTERM, 2.0), (signal.SIGINT, 0.0), (signal.SIGKILL, 0.0)],
    ids=["SIGTERM", "SIGINT-just-up", "SIGKILL-just-up"],
)
def test_the_cluster_script_stops_every_component(sig: signal.Signals, settle: float, tmp_path: Path) -> None:
    missing = missing_binaries(bin_dir())
    if missing:
        pytest.skip(f"control plane not built ({', '.join(missing)} missing); tests/run.sh builds it")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert proc.stdout is not None
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("export KUBECONFIG="):
                break
        else:
            pytest.fail("the script ended before the control plane was up:\n" + "".join(lines[-30:]))
        components = _descendants(proc.pid)
        assert COMPONENTS <= set(components.values()) <= set(BINARIES), components
        time.sleep(settle)
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
        if sig is not signal.SIGKILL:
            assert code == 128 + sig, "".join(lines[-20:])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(pid) for pid in components):
            time.sleep(0.2)
        assert {name for pid, name in components.items() if _alive(pid)} == set()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
