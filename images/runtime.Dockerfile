# syntax=docker/dockerfile:1
# The runtime image: one image for every data-plane process, chosen by its arguments.
#
#   docker build -f images/runtime.Dockerfile -t ghcr.io/omni-dev/omni-runtime:0.1.0 .
#   make images     # a CPU variant with buildah, on a Debian base made locally (images/build.sh):
#                   # BASE_IMAGE=localhost/omni-base:bookworm PYTHON=python3.11
#                   # TORCH_INDEX_URL=https://pypi.org/simple
#
#   omni serve --model-path /models/model ...   a worker API (and its local stages)
#   omni stage --stages thinker --port 9001 ... stage pods (thinker ranks, talker, encoders)
#   omni router --source kubernetes ...         the session router
#
# This is RuntimeSpec.image's default (ghcr.io/omni-dev/omni-runtime:0.1.0); the operator's renderer
# writes the command lines. It runs as UID 10001 with a read-only root filesystem: every write goes
# to /tmp (HOME and scratch) or /var/cache/omni (tiny checkpoint, Hugging Face files), both
# declared volumes here and emptyDirs in the rendered pods.
#
# Base pinned by tag; pin the digest too when publishing:
#   FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04@sha256:<digest of the tag, from `docker buildx imagetools inspect`>
# BASE_IMAGE may name any Debian-like image; PYTHON is its CPython 3.11+ (installed with apt when
# the base lacks it). Every dependency other than torch is installed at its uv.lock version.

ARG BASE_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
ARG PYTHON=python3.12
ARG TORCH_VERSION=2.15.0
ARG TORCHVISION_VERSION=0.29.2
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ARG UV_VERSION=0.13.9

FROM ${BASE_IMAGE} AS builder
ARG PYTHON
ARG TORCH_VERSION
ARG TORCHVISION_VERSION
ARG TORCH_INDEX_URL
ARG UV_VERSION
# The CA bundle of a TLS-intercepting egress proxy, where the build host sits behind one
# (images/build.sh passes the host's; unset otherwise). Build arguments: nothing reaches the image.
ARG PIP_CERT
ARG SSL_CERT_FILE
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never
# The base's Python (the final stage has the same one, so the venv's interpreter link resolves
# there). Ubuntu re-publishes patch versions under the same name: pinning them would break the
# build on every security update, so the base image tag is the pin.
# hadolint ignore=DL3008
RUN if ! "${PYTHON}" -c "import ensurepip, venv" 2>/dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends "${PYTHON}" "${PYTHON}-venv" \
        && rm -rf /var/lib/apt/lists/*; \
    fi
RUN "${PYTHON}" -m venv /opt/omni/venv \
    && "${PYTHON}" -m venv /opt/uv \
    && /opt/uv/bin/pip install "uv==${UV_VERSION}"
ENV PATH=/opt/omni/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/omni/venv
WORKDIR /src
# The lock, as constraints: the versions the test suite runs with. `make images` mounts the host's
# uv cache on /root/.cache/uv, so what `make setup` downloaded is not downloaded again.
COPY pyproject.toml uv.lock /src/
RUN /opt/uv/bin/uv export --frozen --no-emit-project --no-hashes --quiet --output-file /src/locked.txt
# torch first, in its own layer (the big one, rarely changed).
# hadolint ignore=DL3059
RUN /opt/uv/bin/uv pip install --index-url "${TORCH_INDEX_URL}" --extra-index-url https://pypi.org/simple \
        --index-strategy unsafe-best-match --constraint /src/locked.txt \
        "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"
# The project's other dependencies (read from pyproject.toml), rebuilt only when it or the lock change.
# hadolint ignore=DL3059
RUN /opt/uv/bin/uv pip install --constraint /src/locked.txt --requirement pyproject.toml
COPY README.md /src/
COPY operator /src/operator
COPY runtime /src/runtime
# The project itself; torch is already satisfied and stays the build the index gave. Bytecode is
# compiled here because the root filesystem is read-only at run time (torch's test helpers hold
# files for newer Pythons, which do not compile and are never imported).
RUN /opt/uv/bin/uv pip install --no-deps . \
    && python -m compileall -q -x '/torch/testing/_internal/' /opt/omni/venv \
    && omni --help >/dev/null

FROM ${BASE_IMAGE}
ARG PYTHON
LABEL org.opencontainers.image.title="omni-runtime" \
      org.opencontainers.image.description="omni model runtime: stage servers, worker API, session router" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN if ! command -v "${PYTHON}" >/dev/null || [ ! -e /etc/ssl/certs/ca-certificates.crt ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends "${PYTHON}" ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && groupadd --gid 10001 omni \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin omni \
    && mkdir -p /var/cache/omni /models \
    && chown 10001:10001 /var/cache/omni
COPY --from=builder /opt/omni/venv /opt/omni/venv
# Every cache a library might write points at a writable volume, never at the image.
ENV PATH=/opt/omni/venv/bin:$PATH \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    OMNI_CACHE_DIR=/var/cache/omni \
    HF_HOME=/var/cache/omni/hf \
    TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor \
    TRITON_CACHE_DIR=/tmp/triton \
    MPLCONFIGDIR=/tmp/matplotlib \
    NUMBA_CACHE_DIR=/tmp/numba \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    OMNI_HEALTH_URL=http://127.0.0.1:8000/health
VOLUME ["/tmp", "/var/cache/omni"]
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
# The worker API and the router answer GET /health while alive. Set OMNI_HEALTH_URL for another
# port. (Kubernetes ignores HEALTHCHECK: the rendered pods carry their own probes.)
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['OMNI_HEALTH_URL'], timeout=4)"]
ENTRYPOINT ["omni"]
CMD ["serve"]
