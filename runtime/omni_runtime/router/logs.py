"""Structured JSON logs: one object per line with the event, the worker and the session.

Callers pass their fields as `extra={"fields": {...}}`; the formatter merges them into the line,
so `jq 'select(.worker == "tiny-w0")'` finds everything about one worker.

The per-request line goes through `event()` instead: once `configure()` has installed the line
handler, it writes the same JSON line without building a LogRecord (no caller lookup, no thread
and process lookups), which cut the router's CPU per proxied request by about a quarter.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from typing import Any

_second: tuple[int, str] = (-1, "")  # the last whole second formatted, and its text

# A field or message longer than this is cut: a client controls paths and session keys, and one
# huge log line must not cost the log reader (`omni up`, a terminal, a collector) more than a line.
MAX_FIELD_CHARS = 512
MAX_MESSAGE_CHARS = 4096


def clip(text: str, limit: int = MAX_FIELD_CHARS) -> str:
    """`text`, cut to `limit` characters with a note of how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...[{len(text) - limit} more chars]"


def clip_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields with every string value clipped; the same dict when none needs it."""
    if not any(isinstance(value, str) and len(value) > MAX_FIELD_CHARS for value in fields.values()):
        return fields
    return {key: clip(value) if isinstance(value, str) else value for key, value in fields.items()}


def timestamp(created: float) -> str:
    """ISO 8601 UTC with milliseconds; the seconds part is formatted once per second."""
    global _second
    whole = int(created)
    if _second[0] != whole:
        _second = (whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)))
    return f"{_second[1]}.{int((created - whole) * 1000):03d}Z"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": clip(record.getMessage(), MAX_MESSAGE_CHARS),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(clip_fields(fields))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class BufferedLineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes lines to stderr in batches: a write per request line would cost a syscall per request.

    Warnings and errors go out at once; other lines at most FLUSH_S later (the router's
    lifespan calls `flush_periodically`, and logging flushes at exit).
    """

    FLUSH_S = 0.25

    def __init__(self) -> None:
        super().__init__(open(sys.stderr.fileno(), "w", buffering=1 << 16, encoding="utf-8", closefd=False))  # noqa: SIM115
        self._flushed_at = time.monotonic()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.write_line(self.format(record), urgent=record.levelno >= logging.WARNING)
        except Exception:  # logging must never take the router down; the stdlib reports it
            self.handleError(record)

    def write_line(self, line: str, *, urgent: bool = False) -> None:
        self.stream.write(line + "\n")
        now = time.monotonic()
        if urgent or now - self._flushed_at > self.FLUSH_S:
            self.stream.flush()
            self._flushed_at = now

    def flush(self) -> None:
        super().flush()
        self._flushed_at = time.monotonic()


async def flush_periodically() -> None:
    """Flush buffered log lines even when no new line arrives (the last lines before a quiet spell)."""
    while True:
        await asyncio.sleep(BufferedLineHandler.FLUSH_S)
        for handler in logging.getLogger("omni").handlers:
            handler.flush()


def _line_handler(logger: logging.Logger) -> BufferedLineHandler | None:
    """The one handler a record from this logger reaches, when it is our line handler; else None."""
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        if current.handlers:
            handler = current.handlers[0]
            if len(current.handlers) > 1 or current.propagate or not isinstance(handler, BufferedLineHandler):
                return None
            return handler if handler.level <= logging.INFO and not handler.filters else None
        if not current.propagate:
            return None
        current = current.parent
    return None


def event(logger: logging.Logger, msg: str, fields: dict[str, Any]) -> None:
    """Log one INFO line with fields: the hot path's `logger.info(msg, extra={"fields": fields})`."""
    if not logger.isEnabledFor(logging.INFO):
        return
    handler = _line_handler(logger)
    if handler is None:  # not set up by configure(): the standard way
        logger.info(msg, extra={"fields": clip_fields(fields)})
        return
    line = {
        "ts": timestamp(time.time()),
        "level": "info",
        "logger": logger.name,
        "msg": msg,
        **clip_fields(fields),
    }
    handler.acquire()
    try:
        try:
            text = json.dumps(line)  # no default=: json.dumps then reuses its cached encoder
        except TypeError:
            text = json.dumps(line, default=str)
        handler.write_line(text)
    except Exception:  # as logging does: report on stderr, never fail the request
        handler.handleError(logger.makeRecord(logger.name, logging.INFO, "", 0, msg, (), None))
    finally:
        handler.release()


def configure(level: str = "info") -> None:
    """Send the router's and uvicorn's logs to stderr as JSON lines."""
    handler = BufferedLineHandler()
    handler.setFormatter(JsonFormatter())
    for name in ("omni", "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False
        logger.setLevel(level.upper())
    # The router writes its own request lines with worker and session ids.
    logging.getLogger("uvicorn.access").disabled = True
