"""Which uvicorn access-log lines `omni serve` keeps: every request but a successful probe."""

from __future__ import annotations

import logging

import pytest

from omni_runtime.entrypoints.console import QuietProbes


def _access(path: str, status: int) -> logging.LogRecord:
    args = ("127.0.0.1:5000", "GET", path, "1.1", status)
    return logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d', args, None)


@pytest.mark.parametrize(
    ("path", "status", "kept"),
    [
        ("/ready", 200, False),
        ("/health", 200, False),
        ("/health", 204, False),
        ("/ready?verbose=1", 200, False),
        ("/ready", 503, True),  # a failing probe is news
        ("/health", 500, True),
        ("/ready", 404, True),
        ("/v1/chat/completions", 200, True),
        ("/readyz", 200, True),
        ("/metrics", 200, True),
        ("/v1/ready", 200, True),
    ],
)
def test_quiet_probes(path: str, status: int, kept: bool) -> None:
    assert QuietProbes().filter(_access(path, status)) is kept


def test_other_records_pass() -> None:
    record = logging.LogRecord("uvicorn.access", logging.INFO, "", 0, "plain message", None, None)
    assert QuietProbes().filter(record) is True
