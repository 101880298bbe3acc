# syntax=docker/dockerfile:1
# The runtime image: one image for every data-plane process, chosen by its arguments.
#
#   docker build -f images/runtime.Dockerfile -t ghcr.io/omni-dev/omni-runtime:0.1.0 .
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

ARG TORCH_VERSION=2.15.0
ARG TORCHVISION_VERSION=0.29.2
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128

FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04 AS builder
ARG TORCH_VERSION
ARG TORCHVISION_VERSION
ARG TORCH_INDEX_URL
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# Ubuntu's Python 3.12 (the final stage installs the same package, so the venv's interpreter link
# resolves there). Ubuntu re-publishes patch versions under the same name: pinning them would break
# the build on every security update, so the base image tag is the pin.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 python3.12-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3.12 -m venv /opt/omni/venv
ENV PATH=/opt/omni/venv/bin:$PATH
# torch from the CUDA wheel index first, in its own layer (the big one, rarely changed).
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md /src/
COPY operator /src/operator
COPY runtime /src/runtime
# The project and its remaining dependencies; torch is already satisfied and stays the CUDA build.
RUN pip install . \
    && python -m compileall -q /opt/omni/venv \
    && omni --help >/dev/null

FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04
LABEL org.opencontainers.image.title="omni-runtime" \
      org.opencontainers.image.description="omni model runtime: stage servers, worker API, session router" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
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
