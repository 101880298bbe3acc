"""Where the worker table comes from: one interface, a file source and a fixed list.

A source gives a complete snapshot once at start (`load`, blocking, raising WorkerTableError with a
message naming the field) and then keeps calling `apply` with new snapshots while `watch` runs, so
changes take effect without a restart. The Kubernetes source lives in k8s_source.py, the only
module that imports the Kubernetes client.

The file format (local mode, written by `omni up`):
    {"workers": [{"id": "tiny-w0", "url": "http://127.0.0.1:8101", "revision": "abc123",
                  "state": "starting|ready|draining|gone"}]}
`state` defaults to ready (the /ready check still gates traffic); unknown keys are ignored so
writers can add their own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from omni_runtime.router.table import WorkerSpec, WorkerState

log = logging.getLogger("omni.router")

Apply = Callable[[list[WorkerSpec]], None]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class WorkerTableError(ValueError):
    """A worker table that cannot be used; the message names the field and the fix."""


class WorkerSource(Protocol):
    def describe(self) -> str: ...

    def load(self) -> list[WorkerSpec]: ...

    async def watch(self, apply: Apply) -> None: ...


def parse_worker(entry: Any, *, where: str) -> WorkerSpec:
    """One worker entry of the file (or any source using the same fields)."""
    if not isinstance(entry, dict):
        raise WorkerTableError(f"{where}: expected an object with id, url, revision, state")
    for name in ("id", "url", "revision"):
        value = entry.get(name)
        if not isinstance(value, str) or not value:
            raise WorkerTableError(f"{where}.{name}: required, a non-empty string")
    worker_id, url, revision = entry["id"], entry["url"], entry["revision"]
    if not _DNS_LABEL.match(worker_id) or len(worker_id) > 63:
        raise WorkerTableError(
            f"{where}.id: {worker_id!r} is not a DNS label (lower-case letters, digits and '-', "
            "at most 63 characters); session ids embed it"
        )
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise WorkerTableError(f"{where}.url: {url!r} is not an http:// or https:// URL with a host")
    if parts.path not in {"", "/"} or parts.query or parts.fragment:
        raise WorkerTableError(
            f"{where}.url: {url!r} must be a base URL without a path, e.g. http://host:8000"
        )
    state_raw = entry.get("state", WorkerState.ready.value)
    try:
        state = WorkerState(state_raw)
    except ValueError:
        allowed = ", ".join(state.value for state in WorkerState)
        raise WorkerTableError(f"{where}.state: {state_raw!r} is not one of {allowed}") from None
    return WorkerSpec(id=worker_id, url=url.rstrip("/"), revision=revision, state=state)


def parse_workers_document(document: Any, *, origin: str) -> list[WorkerSpec]:
    if not isinstance(document, dict) or "workers" not in document:
        raise WorkerTableError(f'{origin}: expected an object {{"workers": [...]}}')
    entries = document["workers"]
    if not isinstance(entries, list):
        raise WorkerTableError(f"{origin}: workers: expected a list of worker objects")
    specs: list[WorkerSpec] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        spec = parse_worker(entry, where=f"{origin}: workers[{index}]")
        if spec.id in seen:
            raise WorkerTableError(
                f"{origin}: workers[{index}].id: {spec.id!r} appears twice; ids must be unique"
            )
        seen.add(spec.id)
        specs.append(spec)
    return specs


def parse_workers_text(text: str, *, origin: str) -> list[WorkerSpec]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkerTableError(
            f"{origin}: not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    return parse_workers_document(document, origin=origin)


class FileSource:
    """A JSON worker file, re-read whenever its modification time or size changes."""

    def __init__(self, path: str | os.PathLike[str], *, poll_interval: float = 0.5) -> None:
        self.path = Path(path)
        self.poll_interval = poll_interval
        self._stamp: tuple[int, int] | None = None

    def describe(self) -> str:
        return f"file {self.path}"

    def _read(self) -> tuple[tuple[int, int], list[WorkerSpec]]:
        try:
            stat = self.path.stat()
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise WorkerTableError(f"{self.path}: no such file (--workers-file)") from None
        except OSError as exc:
            raise WorkerTableError(f"{self.path}: cannot read: {exc.strerror}") from None
        return (stat.st_mtime_ns, stat.st_size), parse_workers_text(text, origin=str(self.path))

    def load(self) -> list[WorkerSpec]:
        stamp, specs = self._read()
        self._stamp = stamp
        return specs

    def changed(self) -> list[WorkerSpec] | None:
        """A new snapshot when the file changed and parses; None otherwise (bad edits keep the old table)."""
        try:
            stat = self.path.stat()
        except OSError:
            return None
        if (stat.st_mtime_ns, stat.st_size) == self._stamp:
            return None
        try:
            stamp, specs = self._read()
        except WorkerTableError as exc:
            # Do not record the stamp: a half-written file is read again at the next poll.
            log.error(
                "worker file rejected, keeping the previous table", extra={"fields": {"error": str(exc)}}
            )
            return None
        self._stamp = stamp
        return specs

    async def watch(self, apply: Apply) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            specs = self.changed()
            if specs is not None:
                apply(specs)


class StaticSource:
    """A fixed worker list: for benchmarks and tests that build the router in process."""

    def __init__(self, specs: list[WorkerSpec]) -> None:
        self.specs = list(specs)

    def describe(self) -> str:
        return f"static list of {len(self.specs)} workers"

    def load(self) -> list[WorkerSpec]:
        return list(self.specs)

    async def watch(self, apply: Apply) -> None:
        await asyncio.Event().wait()
