"""The router's JSON log lines: the hot path's `event()` writes what `logger.info` with fields writes."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from omni_runtime.router import logs

NAMES = ("omni", "uvicorn", "uvicorn.error")


@pytest.fixture
def configured() -> Iterator[None]:
    """logs.configure() for one test; the loggers it changes are put back afterwards."""
    saved = {
        name: (
            logging.getLogger(name).handlers[:],
            logging.getLogger(name).propagate,
            logging.getLogger(name).level,
        )
        for name in NAMES
    }
    logs.configure("info")
    try:
        yield
    finally:
        for name, (handlers, propagate, level) in saved.items():
            logger = logging.getLogger(name)
            for handler in logger.handlers:
                handler.flush()
            logger.handlers[:] = handlers
            logger.propagate = propagate
            logger.setLevel(level)


def _lines(capfd: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    for handler in logging.getLogger("omni").handlers:
        handler.flush()
    return [json.loads(line) for line in capfd.readouterr().err.splitlines() if line.strip()]


def test_event_writes_the_same_line_as_logger_info(
    capfd: pytest.CaptureFixture[str], configured: None
) -> None:
    log = logging.getLogger("omni.router")
    fields = {"event": "request", "status": 200, "worker": "w0", "session": None, "ms": 1.25}
    logs.event(log, "request", fields)
    log.info("request", extra={"fields": fields})
    fast, standard = _lines(capfd)
    assert isinstance(fast.pop("ts"), str) and isinstance(standard.pop("ts"), str)
    assert fast == standard == {"level": "info", "logger": "omni.router", "msg": "request", **fields}


def test_event_honours_the_level_and_odd_values(capfd: pytest.CaptureFixture[str], configured: None) -> None:
    log = logging.getLogger("omni.router")
    logging.getLogger("omni").setLevel(logging.WARNING)
    logs.event(log, "request", {"event": "request"})
    assert _lines(capfd) == []
    logging.getLogger("omni").setLevel(logging.INFO)
    logs.event(log, "request", {"path": b"/bytes"})  # not JSON: written with str(), not dropped
    (line,) = _lines(capfd)
    assert line["path"] == "b'/bytes'"


def test_event_without_configure_goes_through_logging(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="omni.router"):
        logs.event(logging.getLogger("omni.router"), "request", {"worker": "w1"})
    (record,) = caplog.records
    assert record.getMessage() == "request"
    assert record.fields == {"worker": "w1"}  # type: ignore[attr-defined]


def test_timestamp_is_utc_with_milliseconds() -> None:
    assert logs.timestamp(1.25) == "1970-01-01T00:00:01.250Z"
    assert logs.timestamp(86_400 + 59.5) == "1970-01-02T00:00:59.500Z"
    assert logs.timestamp(1.75) == "1970-01-01T00:00:01.750Z"  # the cached second, new milliseconds
