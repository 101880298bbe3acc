# syntax=docker/dockerfile:1
# The client pod of the real-node tests (tests/e2e/test_node_*.py): the `openai` package and
# `websockets` at the versions uv.lock pins, on the Debian base images/build.sh makes. Built by
# `images/build.sh test-client`; never published.
ARG BASE_IMAGE=localhost/omni-base:bookworm
FROM ${BASE_IMAGE}
ARG PIP_CERT
ARG SSL_CERT_FILE
ARG REQUIREMENTS="openai websockets"
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN python -m venv /opt/client && /opt/client/bin/pip install ${REQUIREMENTS}
ENV PATH=/opt/client/bin:$PATH
USER 10001:10001
