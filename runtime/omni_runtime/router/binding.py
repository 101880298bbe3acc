"""Which worker a request or WebSocket goes to: pure functions over the worker table.

Three rules, in order (DESIGN.md, "Sessions and the router"):
1. A session id that names its worker (omni_runtime.contract.sessions) in a path segment, in the
   `session_id` query parameter or in the session-key header pins the request to that worker, so
   every router replica routes follow-ups alike without shared state. A draining worker keeps
   these; a gone one answers 503.
2. A session-key header without a worker inside sticks by rendezvous (highest-random-weight)
   hashing over the workers in rotation: when a worker joins or leaves, only the keys that rank it
   first move. The hash is blake2b, not Python's salted `hash()`, so every process agrees.
3. Everything else goes to the least-loaded worker in rotation; equal loads are broken by fewest
   sessions ever assigned, then by worker id, so the choice is deterministic. Workers whose last
   /ready said every speech stream slot was taken come after all the others.

Rules 2 and 3 give an ordered list of candidates: the second is where a request that could not
connect is retried once. A worker at `max_sessions_per_worker` is skipped; none left means 503.
A worker that refuses a new request or session at its speech stream limit (`capacity_refused`: a
429 or a WebSocket handshake with `x-omni-capacity: speech`) is passed over the same way: the
request goes to the next candidate not yet tried, before any byte reached the client; when every
candidate refused, the last refusal goes to the client as it is. Pinned sessions never move.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from omni_runtime.contract.sessions import worker_of
from omni_runtime.contract.workers import CAPACITY_HEADER, CAPACITY_SPEECH
from omni_runtime.router.errors import RouterError
from omni_runtime.router.table import Worker, WorkerTable

SESSION_QUERY_PARAM = "session_id"
# Session ids the router makes are about 40 characters; a longer value is never one of them (and
# the session-key header is refused above RouterConfig.max_session_key_bytes before binding).
MAX_SESSION_ID_CHARS = 256


class BindKind(StrEnum):
    SESSION = "session"  # pinned by a worker-naming session id
    KEY = "key"  # consistent hashing of the session-key header
    LEAST_LOADED = "least_loaded"


@dataclass(frozen=True)
class Binding:
    kind: BindKind
    candidates: tuple[str, ...]  # worker ids, best first; a pinned session has exactly one
    session: str | None = None  # the session id or session key, for logs


def session_id_in(*, path: str, query: Mapping[str, str], header_value: str | None) -> tuple[str, str] | None:
    """The first worker-naming session id in the request and the worker it names, if any."""
    values: list[str] = []
    if header_value:
        values.append(header_value)
    if SESSION_QUERY_PARAM in query:
        values.append(query[SESSION_QUERY_PARAM])
    if "." in path:  # every session id has a dot; most paths have none
        values.extend(segment for segment in path.split("/") if segment)
    for value in values:
        if len(value) > MAX_SESSION_ID_CHARS:
            continue
        worker_id = worker_of(value)
        if worker_id is not None:
            return value, worker_id
    return None


def _weight(key: str, worker_id: str) -> int:
    digest = hashlib.blake2b(f"{key}\x00{worker_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rank_by_key(key: str, worker_ids: Iterable[str]) -> list[str]:
    """Rendezvous order of worker ids for a key: highest weight first, ties by id."""
    return sorted(worker_ids, key=lambda worker_id: (-_weight(key, worker_id), worker_id))


def rank_by_load(workers: Iterable[Worker]) -> list[str]:
    """Least-loaded order: workers with free speech streams first, then fewest live sessions, then
    fewest ever assigned, then id."""
    ordered = sorted(
        workers, key=lambda worker: (worker.speech_full, worker.sessions, worker.assigned, worker.id)
    )
    return [worker.id for worker in ordered]


def _pinned(table: WorkerTable, *, session: str, worker_id: str) -> Binding:
    worker = table.get(worker_id)
    if worker is None or not worker.keeps_sessions:
        raise RouterError.session_worker_unavailable(session=session, worker_id=worker_id)
    return Binding(kind=BindKind.SESSION, candidates=(worker_id,), session=session)


def _open_workers(table: WorkerTable) -> list[Worker]:
    rotation = table.in_rotation()
    if not rotation:
        raise RouterError.no_ready_worker(known=[worker.id for worker in table.workers()])
    open_ = [worker for worker in rotation if table.has_capacity(worker)]
    if not open_:
        raise RouterError.all_workers_full(limit=table.max_sessions_per_worker, count=len(rotation))
    return open_


def bind(
    table: WorkerTable,
    *,
    path: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    session_header: str,
) -> Binding:
    """Decide where a new request or WebSocket goes. `headers` keys are lower case."""
    header_value = headers.get(session_header.lower())
    found = session_id_in(path=path, query=query, header_value=header_value)
    if found is not None:
        session, worker_id = found
        return _pinned(table, session=session, worker_id=worker_id)
    open_ = _open_workers(table)
    if header_value:
        ranked = rank_by_key(header_value, [worker.id for worker in open_])
        return Binding(kind=BindKind.KEY, candidates=tuple(ranked), session=header_value)
    return Binding(kind=BindKind.LEAST_LOADED, candidates=tuple(rank_by_load(open_)))


def retry_candidate(binding: Binding, *, failed: Sequence[str], table: WorkerTable) -> str | None:
    """Where to retry a request that could not connect: the next candidate still in rotation."""
    if binding.kind is BindKind.SESSION:
        return None  # a session lives on exactly one worker; never move it
    for worker_id in binding.candidates:
        worker = table.get(worker_id)
        if worker_id in failed or worker is None:
            continue
        if worker.in_rotation and table.has_capacity(worker):
            return worker_id
    return None


_CAPACITY_HEADER = CAPACITY_HEADER.encode()
_CAPACITY_SPEECH = CAPACITY_SPEECH.encode()


def capacity_refused(headers: Iterable[tuple[bytes, bytes]], *, status: int | None = None) -> bool:
    """Whether a worker's answer is a refusal at its speech stream limit: a 429 (HTTP; `status` given)
    or a WebSocket handshake (no status) carrying `x-omni-capacity: speech`. Header names are lower
    case, as the upstream client and the WebSocket client give them."""
    if status is not None and status != 429:
        return False
    return any(name == _CAPACITY_HEADER and value.strip() == _CAPACITY_SPEECH for name, value in headers)
