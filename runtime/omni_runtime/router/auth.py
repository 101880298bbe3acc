"""Client API keys and the admin API's own credential: files of keys, checked in constant time.

Clients and operators hold different keys. `--api-keys-file` keys open the proxied API; the admin
API (`/admin/...`: list, drain, undrain workers) takes only `--admin-keys-file` keys. A router
without admin keys answers its admin API on loopback only (`omni up`, `kubectl port-forward`,
`kubectl exec`), whatever the client sends; client API keys never open it.
"""

from __future__ import annotations

import hmac
import ipaddress
from pathlib import Path

from omni_runtime.router.errors import RouterError
from omni_runtime.router.sources import WorkerTableError

# Probes and scrapers carry no keys.
EXEMPT_PATHS = frozenset({"/health", "/ready", "/metrics"})


class ApiKeysError(WorkerTableError):
    """An unusable --api-keys-file."""


ADMIN_PREFIX = "/admin/"


def is_admin_path(path: str) -> bool:
    return path.startswith(ADMIN_PREFIX) or path == "/admin"


def load_api_keys(path: str | Path, *, flag: str = "--api-keys-file") -> tuple[bytes, ...]:
    """Keys from a file: one per line; blank lines and lines starting with # are skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ApiKeysError(f"{flag} {path}: cannot read: {exc.strerror}") from None
    keys = tuple(
        line.strip().encode()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    )
    if not keys:
        raise ApiKeysError(f"{flag} {path}: no keys in the file; write one key per line")
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


def is_loopback(client: tuple[str, int] | list[object] | None) -> bool:
    """Whether a connection's peer is this machine: a loopback address, or a Unix socket (no peer)."""
    if client is None:
        return True  # a Unix socket (the replicas' private sockets): only this machine reaches it
    try:
        address = ipaddress.ip_address(str(client[0]))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def admin_refusal(
    *,
    client: tuple[str, int] | list[object] | None,
    authorization: bytes | None,
    admin_keys: tuple[bytes, ...],
    api_keys: tuple[bytes, ...],
) -> RouterError | None:
    """None when an admin request may go on, else the error to answer (401 or 403)."""
    if admin_keys:
        if authorized(authorization, admin_keys):
            return None
        if api_keys and authorized(authorization, api_keys):
            return RouterError.admin_forbidden(
                reason="A client API key cannot use the admin API: send `Authorization: Bearer <key>` "
                "with a key from the router's --admin-keys-file."
            )
        return RouterError.admin_unauthorized()
    if is_loopback(client):
        return None
    return RouterError.admin_forbidden(
        reason="The admin API answers only on loopback when the router has no --admin-keys-file: "
        "call it from the router's own machine (or `kubectl port-forward`), or start the router "
        "with --admin-keys-file and send `Authorization: Bearer <admin key>`."
    )
