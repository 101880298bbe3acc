#!/usr/bin/env bash
# Build the test control plane from upstream Go modules with the local Go toolchain.
#
# Everything comes through the Go module proxy at the versions pinned in go.mod/go.sum (this
# directory) and kwok/go.mod: kube-apiserver, kube-controller-manager, kube-scheduler and kubectl
# from k8s.io/kubernetes, etcd from go.etcd.io/etcd/server/v3, kwok from sigs.k8s.io/kwok.
# No prebuilt binaries are downloaded.
#
# The binaries land in a cache outside the repository, keyed by a hash of the recipe:
#   ${OMNI_CONTROLPLANE_CACHE:-~/.cache/omni/controlplane}/<recipe-hash>/bin
# The hash covers what decides the binaries (Go version, go.mod/go.sum of both modules, versions and
# flags below), not this script's prose. A complete cache is reused. `build.sh --print-bin-dir`
# prints that directory and builds nothing. One binary at a time (the test machines are small);
# progress goes to stdout. kwok's default node and pod lifecycle stages (the ones kwokctl uses)
# are copied from the kwok module source into kwok-stages.yaml next to the binaries.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! command -v go >/dev/null 2>&1; then
  echo "build.sh: the Go toolchain (go) is not on PATH; install Go 1.26 or newer" >&2
  exit 1
fi
CACHE_ROOT="${OMNI_CONTROLPLANE_CACHE:-${HOME}/.cache/omni/controlplane}"
JOBS="${OMNI_BUILD_JOBS:-2}"

# Versions stamped into the Kubernetes binaries (they must match go.mod's k8s.io/kubernetes).
K8S_VERSION="v1.36.3"
K8S_MAJOR="1"
K8S_MINOR="36"

BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kubectl)

K8S_LDFLAGS="-s -w \
 -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} \
 -X k8s.io/component-base/version.gitMajor=${K8S_MAJOR} \
 -X k8s.io/component-base/version.gitMinor=${K8S_MINOR} \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/client-go/pkg/version.gitVersion=${K8S_VERSION} \
 -X k8s.io/client-go/pkg/version.gitMajor=${K8S_MAJOR} \
 -X k8s.io/client-go/pkg/version.gitMinor=${K8S_MINOR}"
GO_BUILD_FLAGS="-trimpath CGO_ENABLED=0 GOFLAGS=-mod=mod"
KWOK_STAGES=(node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
  pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml)

recipe_hash() {
  {
    go version
    cat "${HERE}/go.mod" "${HERE}/go.sum" "${HERE}/kwok/go.mod" "${HERE}/kwok/go.sum"
    echo "${BINARIES[*]} | ${K8S_LDFLAGS} | ${GO_BUILD_FLAGS} | ${KWOK_STAGES[*]}"
  } | sha256sum | cut -c1-16
}

BIN_DIR="${CACHE_ROOT}/$(recipe_hash)/bin"

if [[ "${1:-}" == "--print-bin-dir" ]]; then
  echo "${BIN_DIR}"
  exit 0
fi

complete() {
  local b
  for b in "${BINARIES[@]}"; do
    [[ -x "${BIN_DIR}/${b}" ]] || return 1
  done
  [[ -f "${BIN_DIR}/kwok-stages.yaml" ]]
}

if complete; then
  echo "control plane binaries present in ${BIN_DIR}"
  exit 0
fi

mkdir -p "${BIN_DIR}"
export GOFLAGS="-mod=mod"
export CGO_ENABLED=0

# build NAME MODULE_DIR PACKAGE LDFLAGS: one binary, written atomically (a killed build leaves no
# half-written file that a later run would take for a complete one).
build() {
  local name="$1" dir="$2" pkg="$3" ldflags="$4"
  if [[ -x "${BIN_DIR}/${name}" ]]; then
    echo "[build] ${name}: cached"
    return 0
  fi
  local start=$SECONDS
  echo "[build] ${name}: go build ${pkg} (this can take many minutes on a cold cache)"
  (cd "${dir}" && go build -p "${JOBS}" -trimpath -ldflags="${ldflags}" -o "${BIN_DIR}/.${name}.tmp" "${pkg}")
  mv "${BIN_DIR}/.${name}.tmp" "${BIN_DIR}/${name}"
  echo "[build] ${name}: done in $((SECONDS - start)) s, $(du -h "${BIN_DIR}/${name}" | cut -f1)"
}

total_start=$SECONDS
build etcd "${HERE}" go.etcd.io/etcd/server/v3 "-s -w"
build kube-apiserver "${HERE}" k8s.io/kubernetes/cmd/kube-apiserver "${K8S_LDFLAGS}"
build kube-controller-manager "${HERE}" k8s.io/kubernetes/cmd/kube-controller-manager "${K8S_LDFLAGS}"
build kube-scheduler "${HERE}" k8s.io/kubernetes/cmd/kube-scheduler "${K8S_LDFLAGS}"
build kwok "${HERE}/kwok" sigs.k8s.io/kwok/cmd/kwok "-s -w"
build kubectl "${HERE}" k8s.io/kubernetes/cmd/kubectl "${K8S_LDFLAGS}"

if [[ ! -f "${BIN_DIR}/kwok-stages.yaml" ]]; then
  KWOK_SRC="$(cd "${HERE}/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  for f in "${KWOK_STAGES[@]}"; do
    echo "---"
    cat "${KWOK_SRC}/kustomize/stage/${f}"
  done > "${BIN_DIR}/.kwok-stages.yaml.tmp"
  mv "${BIN_DIR}/.kwok-stages.yaml.tmp" "${BIN_DIR}/kwok-stages.yaml"
  echo "[build] kwok-stages.yaml: default node and pod stages from ${KWOK_SRC}"
fi
echo "[build] all binaries in ${BIN_DIR} ($((SECONDS - total_start)) s)"
