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

# The installer and the lock, read by the image's RUN steps through a bind mount: neither reaches
# the image. (The venv itself is built in the final stage: copying a 6 GB venv from a builder stage
# held it twice in the build's storage, and a CI machine ran out of disk on that copy.)
FROM ${BASE_IMAGE} AS tools
ARG PYTHON
ARG UV_VERSION
ARG PIP_CERT
ARG SSL_CERT_FILE
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# hadolint ignore=DL3008
RUN if ! "${PYTHON}" -c "import ensurepip, venv" 2>/dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends "${PYTHON}" "${PYTHON}-venv" \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && "${PYTHON}" -m venv /opt/uv \
    && /opt/uv/bin/pip install "uv==${UV_VERSION}"
WORKDIR /opt/uv/lock
# The lock, as constraints: the versions the test suite runs with.
COPY pyproject.toml uv.lock /opt/uv/lock/
RUN /opt/uv/bin/uv export --frozen --no-emit-project --no-hashes --quiet --output-file /opt/uv/lock/locked.txt

FROM ${BASE_IMAGE}
ARG PYTHON
ARG TORCH_VERSION
ARG TORCHVISION_VERSION
ARG TORCH_INDEX_URL
# Packages a variant never imports, removed in the layer that installs them: the CPU image drops
# triton (torch's GPU kernel compiler, 1 GB); `import torch` does not need it.
ARG DROP_PACKAGES=""
# The CA bundle of a TLS-intercepting egress proxy, where the build host sits behind one
# (images/build.sh passes the host's; unset otherwise). Build arguments: nothing reaches the image.
ARG PIP_CERT
ARG SSL_CERT_FILE
LABEL org.opencontainers.image.title="omni-runtime" \
      org.opencontainers.image.description="omni model runtime: stage servers, worker API, session router" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV DEBIAN_FRONTEND=noninteractive
# The base's Python with venv. Ubuntu re-publishes patch versions under the same name: pinning
# them would break the build on every security update, so the base image tag is the pin.
# hadolint ignore=DL3008
RUN if ! "${PYTHON}" -c "import ensurepip, venv" 2>/dev/null || [ ! -e /etc/ssl/certs/ca-certificates.crt ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends "${PYTHON}" "${PYTHON}-venv" ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && groupadd --gid 10001 omni \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin omni \
    && mkdir -p /var/cache/omni /models \
    && chown 10001:10001 /var/cache/omni \
    && "${PYTHON}" -m venv --without-pip /opt/omni/venv
ENV PATH=/opt/omni/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/omni/venv
# torch first, in its own layer (the big one, rarely changed). `make images` mounts the host's uv
# cache on /root/.cache/uv, so what `make setup` downloaded is not downloaded again.
# hadolint ignore=DL3059
RUN --mount=type=bind,from=tools,source=/opt/uv,target=/opt/uv \
    /opt/uv/bin/uv pip install --link-mode copy --index-url "${TORCH_INDEX_URL}" --extra-index-url https://pypi.org/simple \
        --index-strategy unsafe-best-match --constraint /opt/uv/lock/locked.txt \
        "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}" \
    && if [ -n "${DROP_PACKAGES}" ]; then /opt/uv/bin/uv pip uninstall ${DROP_PACKAGES}; fi
# The project's other dependencies (read from pyproject.toml), rebuilt only when it or the lock change.
# hadolint ignore=DL3059
RUN --mount=type=bind,from=tools,source=/opt/uv,target=/opt/uv \
    /opt/uv/bin/uv pip install --link-mode copy --constraint /opt/uv/lock/locked.txt --requirement /opt/uv/lock/pyproject.toml \
    && if [ -n "${DROP_PACKAGES}" ]; then /opt/uv/bin/uv pip uninstall ${DROP_PACKAGES}; fi
# The project itself (a wheel built from /src, which stays in the image: a few MB of source); torch
# is already satisfied and stays the build the index gave. Bytecode is compiled here because the
# root filesystem is read-only at run time (torch's test helpers hold files for newer Pythons, which
# do not compile and are never imported).
COPY pyproject.toml README.md /src/
COPY operator /src/operator
COPY runtime /src/runtime
WORKDIR /src
# hadolint ignore=DL3059
RUN --mount=type=bind,from=tools,source=/opt/uv,target=/opt/uv \
    /opt/uv/bin/uv pip install --no-deps --no-cache . \
    && rm -rf /src/build \
    && python -m compileall -q -x '/torch/testing/_internal/' /opt/omni/venv \
    && omni --help >/dev/null
# Every cache a library might write points at a writable volume, never at the image.
ENV HOME=/tmp \
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
