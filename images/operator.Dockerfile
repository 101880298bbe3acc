# syntax=docker/dockerfile:1
# The operator image: `omni operator` on a slim Python, without torch or the media stack.
#
#   docker build -f images/operator.Dockerfile -t ghcr.io/omni-dev/omni-operator:0.1.0 .
#   make images     # the same with buildah, on a Debian base made locally (images/build.sh)
#
# The chart (helm/omni-operator) runs it as `omni operator --namespace NS --liveness-port 8080`
# with a read-only root filesystem, UID 10001 and an emptyDir on /tmp.
#
# Base pinned by tag; pin the digest too when publishing:
#   FROM python:3.11.13-slim-bookworm@sha256:<digest of the tag, from `docker buildx imagetools inspect`>
# BASE_IMAGE may name any Debian-like image whose `python` is a CPython 3.11+ with venv, such as
# the registry-free base images/build.sh makes with mmdebstrap (localhost/omni-base:bookworm).
ARG BASE_IMAGE=python:3.11.13-slim-bookworm

FROM ${BASE_IMAGE} AS builder
# The CA bundle of a TLS-intercepting egress proxy, where the build host sits behind one
# (images/build.sh passes the host's; unset otherwise). Build arguments: nothing reaches the image.
ARG PIP_CERT
ARG SSL_CERT_FILE
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/omni/venv
ENV PATH=/opt/omni/venv/bin:$PATH
WORKDIR /src
# Dependencies first: this layer is rebuilt only when the requirements change.
COPY images/operator-requirements.txt /src/images/operator-requirements.txt
RUN pip install --requirement images/operator-requirements.txt
# The project without its declared dependencies (torch, transformers, av, ... are data-plane only).
COPY pyproject.toml README.md /src/
COPY operator /src/operator
COPY runtime /src/runtime
RUN pip install --no-deps . \
    && python -m compileall -q /opt/omni/venv \
    && omni --help >/dev/null

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="omni-operator" \
      org.opencontainers.image.description="Kubernetes operator for OmniDeployments" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 10001 omni \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin omni
COPY --from=builder /opt/omni/venv /opt/omni/venv
# Everything the process writes goes under /tmp (an emptyDir in Kubernetes, a volume here), so the
# root filesystem can be mounted read-only.
ENV PATH=/opt/omni/venv/bin:$PATH \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    OMNI_LIVENESS_PORT=8080
VOLUME ["/tmp"]
USER 10001:10001
EXPOSE 8080
# kopf's liveness endpoint; the port follows OMNI_LIVENESS_PORT (match --liveness-port).
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('OMNI_LIVENESS_PORT', '8080'), timeout=4)"]
ENTRYPOINT ["omni"]
CMD ["operator", "--liveness-port", "8080"]
