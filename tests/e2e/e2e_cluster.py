"""A real Kubernetes control plane on loopback, for end-to-end tests and benchmarks.

It runs the binaries that tests/e2e/controlplane/build.sh compiles from upstream modules: etcd,
kube-apiserver, kube-controller-manager (garbage collector on), kube-scheduler and kwok (simulated
nodes and pod lifecycle). Certificates are made here with `cryptography`; every component listens
on 127.0.0.1 on a free port; an admin kubeconfig (client certificate, group system:masters) is
written into the work directory. Each wait has a deadline and a failure shows the component's log.

Used by tests/e2e/conftest.py (a session fixture) and tests/e2e/bench_operator.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from e2e_certs import make_certificates, write_kubeconfig
from e2e_nodes import KWOK_NODE_ANNOTATION, NodeShape, gpu_nodes, node_manifest

HERE = Path(__file__).resolve().parent
RECIPE = HERE / "controlplane"
BUILD_SCRIPT = RECIPE / "build.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubectl")
SERVICE_CIDR = "10.96.0.0/16"


class ControlPlaneError(RuntimeError):
    """A component failed to start or become ready; the message carries its log tail."""


# --- binaries ---------------------------------------------------------------------------------


def bin_dir() -> Path:
    """The cache directory build.sh uses for the current recipe (it may not exist yet)."""
    out = subprocess.run(["bash", str(BUILD_SCRIPT), "--print-bin-dir"], capture_output=True, text=True)
    if out.returncode != 0:
        raise ControlPlaneError(
            f"{BUILD_SCRIPT} --print-bin-dir failed (is Go installed?): {out.stderr.strip()}"
        )
    return Path(out.stdout.strip())


def missing_binaries(directory: Path) -> list[str]:
    return [b for b in BINARIES if not os.access(directory / b, os.X_OK)] + (
        [] if (directory / "kwok-stages.yaml").is_file() else ["kwok-stages.yaml"]
    )


def build(*, log: Callable[[str], None] = print) -> Path:
    """Run build.sh (reuses a complete cache), streaming its progress lines."""
    with subprocess.Popen(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log(line.rstrip())
        if proc.wait() != 0:
            raise ControlPlaneError(f"{BUILD_SCRIPT} failed with exit code {proc.returncode}")
    return bin_dir()


# --- processes --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_LIBC = ctypes.CDLL("libc.so.6", use_errno=True)  # loaded here: a forked child must not dlopen
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> Callable[[], None]:
    """A preexec hook: a killed parent (pytest, or this script) must not leave an apiserver behind.

    The kernel sends the child SIGKILL when its parent goes away (PR_SET_PDEATHSIG): SIGTERM is
    not enough, since a kube-apiserver still starting up can sit on it. A parent that died between
    fork and prctl is caught by the parent-pid check.
    """

    def hook() -> None:
        if _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0 or os.getppid() != parent:
            os._exit(1)

    return hook


@dataclass
class Component:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


def wait_for(
    what: str, check: Callable[[], bool], *, timeout: float, component: Component | None = None
) -> None:
    """Poll `check` until it is true; on the deadline raise with the component's log tail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if component is not None and component.proc.poll() is not None:
            raise ControlPlaneError(
                f"{component.name} exited with code {component.proc.returncode} while waiting for {what}:\n"
                f"{component.log_tail()}"
            )
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.25)
    tail = f":\n{component.log_tail()}" if component is not None else ""
    raise ControlPlaneError(f"timed out after {timeout:.0f} s waiting for {what}{tail}")


def spawn(name: str, argv: list[str], workdir: Path, env: dict[str, str]) -> Component:
    """A component process logging to ``workdir/logs/NAME.log``, killed with the test process."""
    log_path = workdir / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), **env},
            preexec_fn=die_with_parent(os.getpid()),
        )
    return Component(name=name, proc=proc, log_path=log_path)


@dataclass
class ControlPlane:
    """A running control plane; `kubeconfig` is what clients (and the operator) use."""

    workdir: Path
    bin_dir: Path
    kubeconfig: Path
    server: str
    certs: dict[str, Path]
    components: dict[str, Component] = field(default_factory=dict)
    nodes: list[NodeShape] = field(default_factory=list)

    def start(self, name: str, args: list[str]) -> Component:
        component = spawn(name, [str(self.bin_dir / name), *args], self.workdir, {"HOME": str(self.workdir)})
        self.components[name] = component
        return component

    def https(self) -> httpx.Client:
        # An SSLContext carries the client certificate (httpx 0.28 no longer honours `cert=`).
        context = ssl.create_default_context(cafile=str(self.certs["ca.crt"]))
        context.load_cert_chain(str(self.certs["admin.crt"]), str(self.certs["admin.key"]))
        return httpx.Client(base_url=self.server, verify=context, timeout=10.0)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run the kubectl built with the control plane against this cluster."""
        result = subprocess.run(
            [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and result.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def stop(self) -> None:
        # Reverse start order, each gone before the next is asked: clients first, etcd last. (Asked
        # all at once, etcd went first and the API server spent its whole 15 s wait retrying it.)
        for component in reversed(list(self.components.values())):
            if component.proc.poll() is None:
                component.proc.terminate()
            try:
                component.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                component.proc.kill()
                component.proc.wait(timeout=5)


def _healthz(url: str) -> Callable[[], bool]:
    def check() -> bool:
        return httpx.get(url, verify=False, timeout=2.0).status_code == 200

    return check


def start_control_plane(
    *,
    bin_dir: Path,
    workdir: Path,
    nodes: list[NodeShape],
    log: Callable[[str], None] = print,
    advertise_address: str = "127.0.0.1",
) -> ControlPlane:
    """Start every component, wait for each to be ready, register `nodes`; stop all on failure.

    `advertise_address` other than loopback serves the API on that address too and keeps the
    `kubernetes` Service's endpoints on it, so pods on a real node reach the API in-cluster."""

    workdir.mkdir(parents=True, exist_ok=True)
    in_cluster = advertise_address != "127.0.0.1"
    certs = make_certificates(workdir / "pki", extra_ips=(advertise_address,) if in_cluster else ())
    api_port = free_port()
    server = f"https://127.0.0.1:{api_port}"
    kubeconfig = workdir / "kubeconfig"
    write_kubeconfig(kubeconfig, server=server, certs=certs)
    cp = ControlPlane(workdir=workdir, bin_dir=bin_dir, kubeconfig=kubeconfig, server=server, certs=certs)
    try:
        _start_all(cp, api_port=api_port, log=log, advertise_address=advertise_address)
        register_nodes(cp, nodes)
    except BaseException:
        cp.stop()
        raise
    return cp


def _start_all(
    cp: ControlPlane, *, api_port: int, log: Callable[[str], None], advertise_address: str
) -> None:
    c = cp.certs
    started = time.monotonic()
    etcd_port, peer_port = free_port(), free_port()
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    etcd = cp.start(
        "etcd",
        [
            "--name=omni-e2e",
            f"--data-dir={cp.workdir / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=omni-e2e=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync",  # a throwaway store: durability costs seconds on a shared disk
            "--log-level=warn",
        ],
    )
    wait_for(
        "etcd /health",
        lambda: httpx.get(f"{etcd_url}/health", timeout=2).json()["health"] == "true",
        timeout=30,
        component=etcd,
    )
    log(f"[control plane] etcd ready on {etcd_url}")

    apiserver = cp.start(
        "kube-apiserver",
        [
            f"--etcd-servers={etcd_url}",
            *(
                [
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    "--endpoint-reconciler-type=none",
                ]
                if advertise_address == "127.0.0.1"
                else ["--bind-address=0.0.0.0", f"--advertise-address={advertise_address}"]
            ),
            f"--secure-port={api_port}",
            # How the API server reaches kubelets (logs, exec) on a real node.
            f"--kubelet-client-certificate={c['admin.crt']}",
            f"--kubelet-client-key={c['admin.key']}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--tls-cert-file={c['apiserver.crt']}",
            f"--tls-private-key-file={c['apiserver.key']}",
            f"--client-ca-file={c['ca.crt']}",
            f"--service-account-key-file={c['sa.pub']}",
            f"--service-account-signing-key-file={c['sa.key']}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
        ],
    )
    with cp.https() as client:
        wait_for(
            "kube-apiserver /readyz",
            lambda: client.get("/readyz").status_code == 200,
            timeout=120,
            component=apiserver,
        )
    log(f"[control plane] kube-apiserver ready on {cp.server} ({time.monotonic() - started:.1f} s)")

    kcm_port, sched_port = free_port(), free_port()
    common = [
        f"--kubeconfig={cp.kubeconfig}",
        f"--authentication-kubeconfig={cp.kubeconfig}",
        f"--authorization-kubeconfig={cp.kubeconfig}",
        "--bind-address=127.0.0.1",
        "--leader-elect=false",
        "--profiling=false",
    ]
    kcm = cp.start(
        "kube-controller-manager",
        [
            *common,
            f"--secure-port={kcm_port}",
            f"--service-account-private-key-file={c['sa.key']}",
            f"--root-ca-file={c['ca.crt']}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--use-service-account-credentials=false",
            # Garbage collector on (the default, said out loud: ownerReferences must cascade).
            "--enable-garbage-collector=true",
            "--concurrent-gc-syncs=10",
            "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller",
            "--v=1",
        ],
    )
    scheduler = cp.start("kube-scheduler", [*common, f"--secure-port={sched_port}", "--v=1"])
    wait_for(
        "kube-controller-manager /healthz",
        _healthz(f"https://127.0.0.1:{kcm_port}/healthz"),
        timeout=60,
        component=kcm,
    )
    wait_for(
        "kube-scheduler /healthz",
        _healthz(f"https://127.0.0.1:{sched_port}/healthz"),
        timeout=60,
        component=scheduler,
    )
    log("[control plane] controller-manager and scheduler healthy")

    kwok_port = free_port()
    kwok = cp.start(
        "kwok",
        [
            f"--kubeconfig={cp.kubeconfig}",
            f"--config={cp.bin_dir / 'kwok-stages.yaml'}",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION[0]}={KWOK_NODE_ANNOTATION[1]}",
            f"--server-address=127.0.0.1:{kwok_port}",
            "--node-lease-duration-seconds=40",
        ],
    )
    wait_for("kwok /healthz", _healthz(f"http://127.0.0.1:{kwok_port}/healthz"), timeout=60, component=kwok)
    with cp.https() as client:
        wait_for(
            "the default service account (controller-manager at work)",
            lambda: client.get("/api/v1/namespaces/default/serviceaccounts/default").status_code == 200,
            timeout=60,
            component=kcm,
        )
    log(f"[control plane] all components up in {time.monotonic() - started:.1f} s")


def register_nodes(cp: ControlPlane, nodes: list[NodeShape]) -> None:
    """Create the nodes and wait until kwok reports each Ready with its GPUs allocatable."""
    with cp.https() as client:
        for node in nodes:
            r = client.post("/api/v1/nodes", json=node_manifest(node))
            if r.status_code not in (201, 409):
                raise ControlPlaneError(f"creating node {node.name}: {r.status_code} {r.text}")

        def all_ready() -> bool:
            items = client.get("/api/v1/nodes").json()["items"]
            ready = {
                n["metadata"]["name"]
                for n in items
                if any(
                    c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])
                )
            }
            return {n.name for n in nodes} <= ready

        wait_for(f"{len(nodes)} kwok nodes Ready", all_ready, timeout=60, component=cp.components.get("kwok"))
    cp.nodes = list(nodes)


@contextlib.contextmanager
def running_control_plane(
    *, workdir: Path, nodes: list[NodeShape], build_if_missing: bool, log: Callable[[str], None] = print
) -> Iterator[ControlPlane]:
    directory = bin_dir()
    if missing_binaries(directory):
        if not build_if_missing:
            raise FileNotFoundError(
                f"control plane binaries missing in {directory}: {', '.join(missing_binaries(directory))}; "
                f"run {BUILD_SCRIPT} (or set OMNI_E2E_BUILD=1)"
            )
        directory = build(log=log)
    cp = start_control_plane(bin_dir=directory, workdir=workdir, nodes=nodes, log=log)
    try:
        yield cp
    finally:
        cp.stop()


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds the with-blocks below: every component is stopped


if __name__ == "__main__":
    # `python tests/e2e/e2e_cluster.py`: start a control plane with 4 GPU nodes and keep it until
    # Ctrl-C or SIGTERM; either stops every component (and a killed script takes them along).
    import tempfile

    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, _exit_on_signal)
    with (
        tempfile.TemporaryDirectory(prefix="omni-cp-") as tmp,
        running_control_plane(workdir=Path(tmp), nodes=gpu_nodes(), build_if_missing=True) as plane,
    ):
        print(f"export KUBECONFIG={plane.kubeconfig}", flush=True)
        while True:
            signal.pause()
