"""Fixtures for end-to-end tests on the real control plane (see e2e_cluster.py).

`control_plane` (session scope) starts etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok on loopback with 4 simulated nodes x 8 `nvidia.com/gpu` (label
omni.dev/gpu-tier=h100) and one CPU node, and tears it all down at the end. When the binaries are
not built it skips, unless OMNI_E2E_BUILD=1 asks it to build them first (tens of minutes cold).
`namespace` gives each test its own namespace so tests never see each other's objects.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from e2e_cluster import (
    BUILD_SCRIPT,
    ControlPlane,
    ControlPlaneError,
    bin_dir,
    build,
    missing_binaries,
    start_control_plane,
    wait_for,
)
from e2e_node import BUILD_SCRIPT as NODE_BUILD_SCRIPT
from e2e_node import RealNode, host_ip, load_images, missing_node_parts, node_bin_dir, start_node
from e2e_nodes import NodeShape, gpu_nodes
from e2e_operator import Api, install_crds

E2E_NODES = [
    *gpu_nodes(4, gpus=8, tier="h100"),
    NodeShape(name="kwok-cpu-0", gpus=0, gpu_tier=None, cpu="32"),
]


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    try:
        directory = bin_dir()
    except ControlPlaneError as exc:
        pytest.skip(str(exc))
    missing = missing_binaries(directory)
    if missing:
        if os.environ.get("OMNI_E2E_BUILD") != "1":
            pytest.skip(
                f"control plane not built ({', '.join(missing)} missing in {directory}); "
                f"run {BUILD_SCRIPT} or set OMNI_E2E_BUILD=1"
            )
        directory = build()
    cp = start_control_plane(
        bin_dir=directory, workdir=tmp_path_factory.mktemp("controlplane"), nodes=E2E_NODES
    )
    try:
        yield cp
    finally:
        cp.stop()


# What `make images` builds (the chart's operator default and examples/tiny-cpu.yaml's runtime) and
# the client image `images/build.sh test-client` builds.
NODE_IMAGES = [
    "ghcr.io/omni-dev/omni-operator:0.1.0",
    "ghcr.io/omni-dev/omni-runtime:0.1.0-cpu",
    "localhost/omni-e2e-client:1",
]


@pytest.fixture(scope="session")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, RealNode]]:
    """A second control plane, served on this host's address, with one real node (containerd,
    kubelet, kube-proxy, CoreDNS) and the project's images loaded into it. Under `make test`
    (OMNI_E2E=1) a missing part fails the run; elsewhere it skips with the command to run."""
    try:
        directory = bin_dir()
        node_directory = node_bin_dir()
    except (ControlPlaneError, OSError) as exc:
        pytest.skip(str(exc))
    missing = missing_binaries(directory) + missing_node_parts(node_directory)
    if missing:
        message = (
            f"the real node cannot start: missing {', '.join(missing)}; run {BUILD_SCRIPT}, "
            f"{NODE_BUILD_SCRIPT}, `make images` and `images/build.sh test-client`"
        )
        if os.environ.get("OMNI_E2E") == "1":
            pytest.fail(message)
        pytest.skip(message)
    workdir = tmp_path_factory.mktemp("node-cluster")
    cp = start_control_plane(bin_dir=directory, workdir=workdir / "cp", nodes=[], advertise_address=host_ip())
    try:
        node = start_node(cp, bin_dir=node_directory, workdir=workdir / "node")
        try:
            load_images(node, NODE_IMAGES)
            yield cp, node
        finally:
            node.stop()
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def crds(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with the OmniDeployment CRD (generated now) and kopf's peering CRDs."""
    install_crds(control_plane)
    return control_plane


@pytest.fixture
def api(crds: ControlPlane, namespace: str) -> Iterator[Api]:
    client = Api(crds, namespace)
    yield client
    client.close()


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace with its default service account (pods are admitted only once it exists)."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    with control_plane.https() as client:
        r = client.post(
            "/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        )
        assert r.status_code == 201, r.text
        wait_for(
            f"service account default in {name}",
            lambda: client.get(f"/api/v1/namespaces/{name}/serviceaccounts/default").status_code == 200,
            timeout=30,
        )
    yield name
    with control_plane.https() as client:
        client.delete(f"/api/v1/namespaces/{name}")
