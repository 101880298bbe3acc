#!/usr/bin/env bash
# `make images`: the runtime (CPU variant) and operator images, built with buildah from
# images/*.Dockerfile on a Debian base made here with mmdebstrap, so no image registry is needed.
#
#   images/build.sh            base (once), operator, runtime; cached: a second run takes seconds
#   images/build.sh base       only the base image
#   OMNI_IMAGE_REPO=...        the repository part of the tags (default ghcr.io/omni-dev)
#
# Caches: the base image and every build layer stay in containers-storage (buildah --layers), and
# the runtime build mounts the host's uv cache (~/.cache/uv, filled by `make setup`) so torch and
# the other locked wheels are not downloaded again. Tools (buildah, podman, runc, mmdebstrap) are
# installed with apt-get when missing and we are root, the way tests/run.sh installs its tools.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
REPO=${OMNI_IMAGE_REPO:-ghcr.io/omni-dev}
SUITE=${OMNI_BASE_SUITE:-bookworm}
BASE=${OMNI_BASE_IMAGE:-localhost/omni-base:$SUITE}
PYTHON=${OMNI_BASE_PYTHON:-python3.11}                  # bookworm's python3
MIRROR=${OMNI_DEBIAN_MIRROR:-http://deb.debian.org/debian}
UV_CACHE=${UV_CACHE_DIR:-$HOME/.cache/uv}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/images/containers.conf}

step() { printf '\n==> %s\n' "$*"; }
elapsed() { printf '    (%ss)\n' "$((SECONDS - $1))"; }

need_tools() {
  local missing=()
  for tool in buildah podman runc mmdebstrap; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    step "installing ${missing[*]} (apt-get)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      buildah podman runc mmdebstrap uidmap >/dev/null
  else
    echo "images/build.sh: missing ${missing[*]}; install them (Debian: apt-get install buildah podman runc mmdebstrap)" >&2
    exit 1
  fi
}

# The host's CA bundle reaches the build steps (never the image) where the host trusts an egress
# proxy's CA through SSL_CERT_FILE/PIP_CERT.
TLS_ARGS=()
HOST_CA=${SSL_CERT_FILE:-${PIP_CERT:-}}
if [ -n "$HOST_CA" ] && [ -f "$HOST_CA" ]; then
  TLS_ARGS=(-v "$HOST_CA:/run/omni-build-ca.crt:ro"
            --build-arg PIP_CERT=/run/omni-build-ca.crt --build-arg SSL_CERT_FILE=/run/omni-build-ca.crt)
fi

make_base() {
  if podman image exists "$BASE"; then
    echo "    $BASE is cached (podman rmi $BASE to remake it)"
    return 0
  fi
  local start=$SECONDS tmp
  step "base image $BASE: Debian $SUITE + python3 with mmdebstrap (no registry)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  mmdebstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
    --aptopt='Acquire::Retries "3"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    "$SUITE" "$tmp/rootfs.tar" "deb $MIRROR $SUITE main" \
    "deb $MIRROR $SUITE-updates main" "deb ${MIRROR%/debian}/debian-security $SUITE-security main"
  podman import --change 'CMD ["python3"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    "$tmp/rootfs.tar" "$BASE" >/dev/null
  elapsed "$start"
}

# A digest of everything a build reads: the Dockerfile, the context .dockerignore lets in, the
# base image and the build arguments. An image labelled with the same digest is up to date, which
# spares buildah's layer-cache checks (they hash the build context for every COPY).
inputs_digest() {  # inputs_digest DOCKERFILE [buildah args...]
  {
    podman image inspect --format '{{.Id}}' "$BASE"
    printf '%s\n' "$@"
    find "$1" .dockerignore pyproject.toml uv.lock README.md images/operator-requirements.txt operator runtime \
      -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*_cache/*' -print0 | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-32
}

build() {  # build NAME DOCKERFILE TAG [buildah args...]
  local name=$1 file=$2 tag=$3 start=$SECONDS digest
  shift 3
  digest=$(inputs_digest "$file" "$@")
  if [ "$(podman image inspect --format '{{index .Labels "dev.omni.build-inputs"}}' "$tag" 2>/dev/null)" = "$digest" ]; then
    step "$name image $tag is up to date (inputs $digest)"
    return 0
  fi
  step "$name image $tag ($file, base $BASE)"
  buildah build --layers --network host --format docker -f "$file" -t "$tag" \
    --label "dev.omni.build-inputs=$digest" --build-arg BASE_IMAGE="$BASE" "${TLS_ARGS[@]}" "$@" .
  elapsed "$start"
}

need_tools
make_base
[ "${1:-all}" = base ] && exit 0
if [ "${1:-all}" = test-client ]; then
  # The real-node tests' client image: openai and websockets as uv.lock pins them.
  pins=$(python3 -c 'import tomllib
lock = tomllib.load(open("uv.lock", "rb"))
print(" ".join(p["name"] + "==" + p["version"] for p in lock["package"] if p["name"] in ("openai", "websockets")))')
  build test-client tests/e2e/node/client.Dockerfile localhost/omni-e2e-client:1 --build-arg REQUIREMENTS="$pins"
  exit 0
fi
build operator images/operator.Dockerfile "$REPO/omni-operator:$VERSION"
mkdir -p "$UV_CACHE"
build runtime images/runtime.Dockerfile "$REPO/omni-runtime:$VERSION-cpu" \
  --build-arg PYTHON="$PYTHON" --build-arg TORCH_INDEX_URL=https://pypi.org/simple --build-arg DROP_PACKAGES=triton \
  -v "$UV_CACHE:/root/.cache/uv"
# Every source change leaves a superseded 5 GB runtime image behind (and buildah's intermediate
# layers): drop the untagged ones so repeated builds do not fill the disk. The next build after a
# source change reinstalls the locked wheels from the uv cache instead of reusing that layer.
# A build that was interrupted leaves its working container behind, holding its image: say so and
# go on (the images built here are complete; only the cleanup waits).
if ! pruned=$(podman image prune --force 2>&1 >/dev/null); then
  echo "    podman image prune: $pruned"
  echo "    (an interrupted build leaves containers that hold its images: buildah rm --all frees them)"
fi
step "images"
podman images --filter reference="$REPO/*" --format '{{.Repository}}:{{.Tag}} {{.Size}}'
