"""A real Kubernetes node on this machine, joined to a test control plane (see e2e_cluster.py).

containerd (Debian's, its own socket and config), the CNI plugins (Debian's: bridge, host-local,
portmap), kubelet and kube-proxy (built from k8s.io/kubernetes by tests/e2e/node/build.sh) and
CoreDNS (built from its module) run as processes of the test, like the control plane. Pods run as
real containers (runc) in their own network namespaces on a bridge; Services work through
kube-proxy's iptables rules; cluster DNS is CoreDNS behind the `kube-dns` Service.

Images come from the local containers-storage (`make images`) into the node's containerd: the node
pulls nothing. containerd's root (its image store) is kept between runs in the cache directory, so
an unchanged image is imported once.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import yaml
from e2e_cluster import Component, ControlPlane, ControlPlaneError, free_port, spawn, wait_for

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "node" / "build.sh"
NODE_BINARIES = ("kubelet", "kube-proxy", "coredns")
NODE_NAME = "omni-node-0"
NODE_LABEL = ("omni.dev/node", "real")
POD_CIDR = "10.244.0.0/24"
CLUSTER_DNS_IP = "10.96.0.10"
PAUSE_IMAGE = "localhost/omni-pause:1"
CNI_BIN_DIR = "/usr/lib/cni"
CACHE_ROOT = Path(os.environ.get("OMNI_NODE_CACHE", Path.home() / ".cache" / "omni" / "node"))


def node_bin_dir() -> Path:
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-bin-dir"], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


def missing_node_parts(directory: Path) -> list[str]:
    """What the node cannot start without: its binaries, the pause image, the Debian tools."""
    missing = [b for b in NODE_BINARIES if not (directory / b).is_file()]
    if not (directory / "pause.tar").is_file():
        missing.append("pause.tar")
    missing += [
        tool for tool in ("containerd", "ctr", "runc", "iptables", "podman") if not shutil.which(tool)
    ]
    missing += [
        f"{CNI_BIN_DIR}/{p}"
        for p in ("bridge", "host-local", "portmap", "loopback")
        if not Path(CNI_BIN_DIR, p).exists()
    ]
    return missing


def host_ip() -> str:
    """The address of the interface holding the default route (what pods reach the host by)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("198.51.100.1", 9))  # no packet is sent: this only picks the route's source
        return str(s.getsockname()[0])


def _sysctl(key: str, value: str) -> None:
    path = Path("/proc/sys") / key.replace(".", "/")
    if not path.exists():
        raise ControlPlaneError(
            f"the kernel has no {key}: the node needs it (for net.bridge.*: modprobe br_netfilter)"
        )
    if path.read_text().strip() != value:
        path.write_text(value)


@dataclass
class RealNode:
    name: str
    ip: str
    workdir: Path
    containerd_socket: Path
    components: dict[str, Component] = field(default_factory=dict)

    def ctr(self, *args: str, stdin: IO[bytes] | None = None, timeout: float = 900) -> str:
        """containerd's own client against this node's containerd, in the CRI namespace."""
        out = subprocess.run(
            ["ctr", "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args],
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
        )
        if out.returncode != 0:
            raise ControlPlaneError(f"ctr {' '.join(args)}: {out.stderr.decode(errors='replace').strip()}")
        return out.stdout.decode()

    def log_tails(self) -> str:
        return "\n".join(f"--- {c.name} ---\n{c.log_tail(30)}" for c in self.components.values())

    def stop(self) -> None:
        """Stop the node and everything it ran: containers (their shims outlive containerd), the
        kubelet's mounts under the work directory, the pod bridge."""
        for component in reversed(list(self.components.values())):
            _terminate(component)
        _clean_leftovers(self)


def _terminate(component: Component) -> None:
    if component.proc.poll() is None:
        component.proc.terminate()
    try:
        component.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        component.proc.kill()
        component.proc.wait(timeout=5)


def _unmount_under(directory: Path) -> None:
    """Unmount what the kubelet and containerd mounted below `directory`, deepest first."""
    prefix = str(directory.resolve()) + "/"
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", mount], capture_output=True)


def _start(node: RealNode, name: str, argv: list[str]) -> Component:
    component = spawn(name, argv, node.workdir, {})
    node.components[name] = component
    return component


def _containerd_config(node: RealNode) -> Path:
    root = CACHE_ROOT / "containerd"
    root.mkdir(parents=True, exist_ok=True)
    cni_conf = node.workdir / "cni"
    cni_conf.mkdir(parents=True, exist_ok=True)
    (cni_conf / "10-omni.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "omni-node",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": "omni0",
                        "isGateway": True,
                        "ipMasq": True,
                        "hairpinMode": True,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": POD_CIDR}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                            "dataDir": str(node.workdir / "cni-ipam"),
                        },
                    },
                    {"type": "portmap", "capabilities": {"portMappings": True}},
                ],
            },
            indent=2,
        )
    )
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    config = f"""version = 2
root = "{root}"
state = "{node.workdir / "containerd-state"}"
[grpc]
  address = "{node.containerd_socket}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  enable_selinux = false
  enable_cdi = false
  # Root here lacks CAP_SYS_RESOURCE: it cannot lower oom_score_adj below its own (pod sandboxes
  # ask for -998), so containerd keeps every container at or above its own score.
  restrict_oom_score_adj = true
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{cni_conf}"
"""
    path = node.workdir / "containerd.toml"
    path.write_text(config)
    return path


def _kubelet_config(node: RealNode, cp: ControlPlane, port: int, healthz_port: int) -> Path:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.ip,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "containerRuntimeEndpoint": f"unix://{node.containerd_socket}",
        # containerd 1.6 does not answer the RuntimeConfig call: kubelet 1.36 falls back to this.
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,  # this kernel mounts cgroup v1
        "failSwapOn": False,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(cp.certs["ca.crt"])},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "clusterDNS": [CLUSTER_DNS_IP],
        "clusterDomain": "cluster.local",
        "resolvConf": "",  # pods get the cluster DNS only, no search domains of this host
        "podLogsDir": str(node.workdir / "pod-logs"),
        "podCIDR": POD_CIDR,
        "maxPods": 40,
        "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "nodeStatusUpdateFrequency": "4s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "protectKernelDefaults": False,
        "localStorageCapacityIsolation": True,
    }
    path = node.workdir / "kubelet.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _kube_proxy_config(node: RealNode, cp: ControlPlane, healthz_port: int, metrics_port: int) -> Path:
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(cp.kubeconfig)},
        "hostnameOverride": node.name,
        "mode": "iptables",
        "clusterCIDR": POD_CIDR,
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        "conntrack": {"maxPerCore": 0},  # leave the kernel's conntrack table size alone
        "iptables": {"masqueradeAll": False, "syncPeriod": "5s", "minSyncPeriod": "0s"},
    }
    path = node.workdir / "kube-proxy.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _corefile(node: RealNode, cp: ControlPlane, health_port: int, ready_port: int) -> Path:
    upstream = "/etc/resolv.conf"
    corefile = f""".:53 {{
    bind {node.ip}
    errors
    health 127.0.0.1:{health_port}
    ready 127.0.0.1:{ready_port}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {cp.kubeconfig} omni-e2e
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    forward . {upstream}
    cache 5
    loadbalance
}}
"""
    path = node.workdir / "Corefile"
    path.write_text(corefile)
    return path


def _dns_service(cp: ControlPlane, node: RealNode) -> None:
    """The `kube-dns` Service on CLUSTER_DNS_IP, its endpoints CoreDNS on the node's address."""
    ports = [
        {"name": "dns", "port": 53, "protocol": "UDP"},
        {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
    ]
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
        "spec": {"clusterIP": CLUSTER_DNS_IP, "ports": [{**p, "targetPort": 53} for p in ports]},
    }
    slice_ = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kube-dns-node",
            "namespace": "kube-system",
            "labels": {
                "kubernetes.io/service-name": "kube-dns",
                "endpointslice.kubernetes.io/managed-by": "omni-e2e",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [node.ip], "conditions": {"ready": True}, "nodeName": node.name}],
        "ports": ports,
    }
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([service, slice_]))


RUNC_ROOT = Path("/run/containerd/runc/k8s.io")  # runc's state for containerd's CRI namespace


def _clean_leftovers(node: RealNode) -> None:
    """Remove what a node leaves on this machine when it stops, or when a killed test could not
    stop it: containers (runc keeps them, and their shims outlive containerd), the kubelet's
    mounts under the work directory, the pod bridge (host-local's fresh IP store must agree)."""
    listing = subprocess.run(
        ["runc", "--root", str(RUNC_ROOT), "list", "--quiet"], capture_output=True, text=True
    )
    for container in listing.stdout.split():
        subprocess.run(["runc", "--root", str(RUNC_ROOT), "kill", container, "KILL"], capture_output=True)
        subprocess.run(
            ["runc", "--root", str(RUNC_ROOT), "delete", "--force", container], capture_output=True
        )
    subprocess.run(["pkill", "-KILL", "-f", "containerd-shim-runc-v2 -namespace k8s.io"], capture_output=True)
    _unmount_under(node.workdir)
    subprocess.run(["ip", "link", "delete", "omni0"], capture_output=True)


def load_images(node: RealNode, images: list[str], *, log: Callable[[str], None] = print) -> None:
    """Import images from containers-storage (podman) into the node's containerd, skipping an
    image whose podman ID was imported before (a marker kept beside containerd's root)."""
    markers = CACHE_ROOT / "imported"
    markers.mkdir(parents=True, exist_ok=True)
    for image in images:
        image_id = subprocess.run(
            ["podman", "image", "inspect", "--format", "{{.Id}}", image], capture_output=True, text=True
        )
        if image_id.returncode != 0:
            raise ControlPlaneError(f"image {image} is not in containers-storage: run `make images` first")
        marker = markers / image.replace("/", "_").replace(":", "_")
        present = image in node.ctr("images", "list", "--quiet")
        if present and marker.is_file() and marker.read_text() == image_id.stdout.strip():
            log(f"[node] image {image}: already in containerd")
            continue
        started = time.monotonic()
        if present:  # a superseded build: drop it first, so containerd collects its 6 GB of layers
            node.ctr("images", "rm", "--sync", image)
        _import_streamed(node, image)
        _discard_unpacked_layers(node, image)
        marker.write_text(image_id.stdout.strip())
        log(f"[node] image {image}: imported in {time.monotonic() - started:.0f} s")


def _import_streamed(node: RealNode, image: str) -> None:
    """`podman save | ctr images import -`: no archive on disk (the runtime image is 5 GB)."""
    save = subprocess.Popen(
        ["podman", "save", "--quiet", "--format", "docker-archive", image],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert save.stdout is not None
    try:
        node.ctr("images", "import", "-", stdin=save.stdout)
    finally:
        save.stdout.close()
        _, err = save.communicate(timeout=60)
    if save.returncode != 0:
        raise ControlPlaneError(f"podman save {image}: {err.decode(errors='replace').strip()}")


def _discard_unpacked_layers(node: RealNode, image: str) -> None:
    """Remove the image's layer blobs once they are unpacked into snapshots, as the CRI plugin's
    discard_unpacked_layers does for pulled images: containers start from the snapshots, and the
    node holds the image once instead of twice (5 GB for the runtime)."""
    listing = node.ctr("images", "list")
    target = next((line.split()[2] for line in listing.splitlines()[1:] if line.split()[0] == image), None)
    if target is None:
        raise ControlPlaneError(f"ctr images import did not create {image}:\n{listing}")
    manifest = json.loads(node.ctr("content", "get", target))
    if "manifests" in manifest:  # an index: its manifest for this platform (an import keeps one)
        manifest = json.loads(node.ctr("content", "get", manifest["manifests"][0]["digest"]))
    layers = [layer["digest"] for layer in manifest["layers"]]
    node.ctr("content", "rm", *layers)


def start_node(
    cp: ControlPlane, *, bin_dir: Path, workdir: Path, log: Callable[[str], None] = print
) -> RealNode:
    """Start containerd, kubelet, kube-proxy and CoreDNS; wait until the node is Ready and DNS
    answers; stop everything on failure."""
    workdir.mkdir(parents=True, exist_ok=True)
    node = RealNode(
        name=NODE_NAME, ip=host_ip(), workdir=workdir, containerd_socket=workdir / "containerd.sock"
    )
    try:
        _start_all(node, cp, bin_dir=bin_dir, log=log)
    except BaseException:
        tails = node.log_tails()
        node.stop()
        log(tails)
        raise
    return node


def _start_all(node: RealNode, cp: ControlPlane, *, bin_dir: Path, log: Callable[[str], None]) -> None:
    started = time.monotonic()
    _clean_leftovers(node)
    _sysctl("net.ipv4.ip_forward", "1")
    _sysctl("net.bridge.bridge-nf-call-iptables", "1")
    containerd = _start(node, "containerd", ["containerd", "--config", str(_containerd_config(node))])
    wait_for("containerd socket", node.containerd_socket.exists, timeout=30, component=containerd)
    wait_for("containerd answers", lambda: bool(node.ctr("version")), timeout=30, component=containerd)
    node.ctr("images", "import", str(bin_dir / "pause.tar"))
    log(f"[node] containerd up ({time.monotonic() - started:.1f} s)")

    kubelet_port, kubelet_healthz = free_port(), free_port()
    kubelet = _start(
        node,
        "kubelet",
        [
            str(bin_dir / "kubelet"),
            f"--config={_kubelet_config(node, cp, kubelet_port, kubelet_healthz)}",
            f"--kubeconfig={cp.kubeconfig}",
            f"--root-dir={node.workdir / 'kubelet'}",
            f"--cert-dir={node.workdir / 'kubelet-pki'}",
            f"--hostname-override={node.name}",
            f"--node-ip={node.ip}",
            f"--node-labels={NODE_LABEL[0]}={NODE_LABEL[1]}",
            "--v=1",
        ],
    )
    with cp.https() as client:

        def ready() -> bool:
            r = client.get(f"/api/v1/nodes/{node.name}")
            conditions = r.json()["status"].get("conditions", []) if r.status_code == 200 else []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        wait_for(f"node {node.name} Ready", ready, timeout=120, component=kubelet)
    log(f"[node] kubelet registered {node.name} Ready ({time.monotonic() - started:.1f} s)")

    proxy_healthz, proxy_metrics = free_port(), free_port()
    proxy = _start(
        node,
        "kube-proxy",
        [
            str(bin_dir / "kube-proxy"),
            f"--config={_kube_proxy_config(node, cp, proxy_healthz, proxy_metrics)}",
            "--v=1",
        ],
    )

    def proxy_healthy() -> bool:
        import httpx

        return httpx.get(f"http://127.0.0.1:{proxy_healthz}/healthz", timeout=2).status_code == 200

    wait_for("kube-proxy /healthz", proxy_healthy, timeout=60, component=proxy)

    health, ready_port = free_port(), free_port()
    coredns = _start(
        node, "coredns", [str(bin_dir / "coredns"), "-conf", str(_corefile(node, cp, health, ready_port))]
    )

    def dns_ready() -> bool:
        import httpx

        return httpx.get(f"http://127.0.0.1:{ready_port}/ready", timeout=2).status_code == 200

    wait_for("CoreDNS /ready", dns_ready, timeout=60, component=coredns)
    _dns_service(cp, node)
    log(f"[node] kube-proxy and CoreDNS up; node ready in {time.monotonic() - started:.1f} s")
