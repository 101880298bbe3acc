"""Structured JSON logs: one object per line with the event, the worker and the session.

Callers pass their fields as `extra={"fields": {...}}`; the formatter merges them into the line,
so `jq 'select(.worker == "tiny-w0")'` finds everything about one worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from typing import Any


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(fields)
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
            self.stream.write(self.format(record) + "\n")
            now = time.monotonic()
            if record.levelno >= logging.WARNING or now - self._flushed_at > self.FLUSH_S:
                self.stream.flush()
                self._flushed_at = now
        except Exception:  # logging must never take the router down; the stdlib reports it
            self.handleError(record)

    def flush(self) -> None:
        super().flush()
        self._flushed_at = time.monotonic()


async def flush_periodically() -> None:
    """Flush buffered log lines even when no new line arrives (the last lines before a quiet spell)."""
    while True:
        await asyncio.sleep(BufferedLineHandler.FLUSH_S)
        for handler in logging.getLogger("omni").handlers:
            handler.flush()


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
