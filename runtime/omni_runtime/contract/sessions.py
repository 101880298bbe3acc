"""Session ids that name their worker, so every router replica routes follow-ups alike.

A worker issues ids of the form ``{prefix}_{worker_id}.{token}``; the router reads the worker id
back without any shared table. Worker ids are DNS labels (no dots, no underscores), so the split is
unambiguous.
"""

from __future__ import annotations

import re
import secrets

_WORKER_ID = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SESSION_ID = re.compile(
    r"^(?P<prefix>[a-z]+)_(?P<worker>[a-z0-9]([-a-z0-9]*[a-z0-9])?)\.(?P<token>[A-Za-z0-9_-]{8,})$"
)


def make_session_id(*, worker_id: str, prefix: str = "sess") -> str:
    if not _WORKER_ID.match(worker_id):
        raise ValueError(f"worker id {worker_id!r} is not a DNS label")
    return f"{prefix}_{worker_id}.{secrets.token_urlsafe(12)}"


def worker_of(session_id: str) -> str | None:
    """The worker id inside a session id, or None when the id is not one of ours."""
    match = _SESSION_ID.match(session_id)
    return match.group("worker") if match else None
