"""Optional client API keys: a file of keys, one per line, checked in constant time."""

from __future__ import annotations

import hmac
from pathlib import Path

from omni_runtime.router.sources import WorkerTableError

# Probes and scrapers carry no keys.
EXEMPT_PATHS = frozenset({"/health", "/ready", "/metrics"})


class ApiKeysError(WorkerTableError):
    """An unusable --api-keys-file."""


def load_api_keys(path: str | Path) -> tuple[bytes, ...]:
    """Keys from a file: one per line; blank lines and lines starting with # are skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ApiKeysError(f"--api-keys-file {path}: cannot read: {exc.strerror}") from None
    keys = tuple(
        line.strip().encode()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    )
    if not keys:
        raise ApiKeysError(f"--api-keys-file {path}: no keys in the file; write one key per line")
    return keys


def authorized(authorization: bytes | None, keys: tuple[bytes, ...]) -> bool:
    """Whether an `Authorization: Bearer <key>` header value carries one of the keys."""
    if not authorization or authorization[:7].lower() != b"bearer ":
        return False
    presented = authorization[7:].strip()
    # Compare against every key, so the time taken does not reveal which one nearly matched.
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(presented, key)
    return matched
