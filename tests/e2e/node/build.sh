#!/usr/bin/env bash
# Build the test node's components from upstream Go modules with the local Go toolchain:
# kubelet and kube-proxy from k8s.io/kubernetes (the control plane's release, pinned in this
# directory's go.mod/go.sum) and CoreDNS from github.com/coredns/coredns (coredns/go.mod, the
# plugins a cluster Corefile uses). containerd, runc, the CNI plugins and iptables come from
# Debian's packages (see install-packages in this script). No prebuilt binaries are downloaded.
#
# Binaries land in a cache outside the repository, keyed by a hash of the recipe:
#   ${OMNI_CONTROLPLANE_CACHE:-~/.cache/omni/controlplane}/node-<recipe-hash>/bin
# `build.sh --print-bin-dir` prints that directory and builds nothing; a complete cache is reused.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! command -v go >/dev/null 2>&1; then
  echo "node build.sh: the Go toolchain (go) is not on PATH; install Go 1.26 or newer" >&2
  exit 1
fi
CACHE_ROOT="${OMNI_CONTROLPLANE_CACHE:-${HOME}/.cache/omni/controlplane}"
JOBS="${OMNI_BUILD_JOBS:-2}"
K8S_VERSION="v1.36.3"
BINARIES=(kubelet kube-proxy coredns)
# The Debian packages the node runs on (containerd 1.6 is still supported by kubelet 1.36, which
# falls back to its configured cgroup driver for runtimes without the RuntimeConfig call).
PACKAGES=(containerd runc containernetworking-plugins iptables conntrack socat ethtool iproute2 procps mount
  buildah podman gcc libc6-dev)
PAUSE_IMAGE="localhost/omni-pause:1"
K8S_LDFLAGS="-s -w \
 -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=36 \
 -X k8s.io/component-base/version.gitTreeState=clean"

recipe_hash() {
  {
    go version
    cat "${HERE}/go.mod" "${HERE}/go.sum" "${HERE}/coredns/go.mod" "${HERE}/coredns/go.sum" "${HERE}/coredns/main.go" \
      "${HERE}/pause.c"
    echo "${BINARIES[*]} | ${K8S_LDFLAGS}"
  } | sha256sum | cut -c1-16
}
BIN_DIR="${CACHE_ROOT}/node-$(recipe_hash)/bin"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
  echo "${BIN_DIR}"
  exit 0
fi

missing_packages=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing_packages+=("$p")
done
if ((${#missing_packages[@]})); then
  echo "[node] installing Debian packages: ${missing_packages[*]}"
  if [[ "$(id -u)" != 0 ]]; then
    echo "node build.sh: need root to install ${missing_packages[*]} (apt-get install -y ${missing_packages[*]})" >&2
    exit 1
  fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing_packages[@]}" >/dev/null
fi

mkdir -p "${BIN_DIR}"
export GOFLAGS="-mod=mod" CGO_ENABLED=0

build() {
  local name="$1" dir="$2" pkg="$3" ldflags="$4"
  if [[ -x "${BIN_DIR}/${name}" ]]; then
    echo "[node] ${name}: cached"
    return 0
  fi
  local start=$SECONDS
  echo "[node] ${name}: go build ${pkg} (many minutes on a cold cache)"
  (cd "${dir}" && go build -p "${JOBS}" -trimpath -ldflags="${ldflags}" -o "${BIN_DIR}/.${name}.tmp" "${pkg}")
  mv "${BIN_DIR}/.${name}.tmp" "${BIN_DIR}/${name}"
  echo "[node] ${name}: done in $((SECONDS - start)) s, $(du -h "${BIN_DIR}/${name}" | cut -f1)"
}

build kubelet "${HERE}" k8s.io/kubernetes/cmd/kubelet "${K8S_LDFLAGS}"
build kube-proxy "${HERE}" k8s.io/kubernetes/cmd/kube-proxy "${K8S_LDFLAGS}"
build coredns "${HERE}/coredns" omni.dev/tests/coredns "-s -w"

# The pod sandbox image: a static pause binary in a scratch image, saved as a docker archive that
# the node's containerd imports.
if [[ ! -f "${BIN_DIR}/pause.tar" ]]; then
  echo "[node] pause image: gcc -static pause.c, buildah commit ${PAUSE_IMAGE}"
  export CONTAINERS_CONF="${CONTAINERS_CONF:-${HERE}/../../../images/containers.conf}"
  gcc -O2 -static -o "${BIN_DIR}/pause" "${HERE}/pause.c"
  ctr=$(buildah from scratch)
  buildah copy "$ctr" "${BIN_DIR}/pause" /pause >/dev/null
  buildah config --entrypoint '["/pause"]' --user 65535:65535 "$ctr"
  buildah commit --quiet --format docker "$ctr" "${PAUSE_IMAGE}" >/dev/null
  buildah rm "$ctr" >/dev/null
  podman save --quiet --format docker-archive -o "${BIN_DIR}/.pause.tar.tmp" "${PAUSE_IMAGE}"
  mv "${BIN_DIR}/.pause.tar.tmp" "${BIN_DIR}/pause.tar"
fi
echo "[node] all binaries in ${BIN_DIR}"
