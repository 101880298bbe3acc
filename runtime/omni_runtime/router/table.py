"""The router's view of its workers: who exists, who may take new sessions, how loaded each is.

Pure bookkeeping with no I/O, so binding decisions can be table-tested. Sources (a file, Kubernetes)
feed complete snapshots of `WorkerSpec`; the health checker sets `healthy`; the proxies open and
close sessions. A worker that leaves the snapshot while sessions are still live stays in the table
as gone until its last session ends, so its sessions can still be counted and closed cleanly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from omni_runtime.contract.workers import WorkerState


@dataclass(frozen=True)
class WorkerSpec:
    """What a source says about one worker."""

    id: str
    url: str  # base URL of the worker API, no trailing slash, e.g. http://127.0.0.1:8101
    revision: str
    state: WorkerState = WorkerState.ready


@dataclass
class Worker:
    """One worker as the router sees it: the source's spec plus what the router observed."""

    spec: WorkerSpec
    healthy: bool = False  # last active /ready check returned 200 (unknown counts as not healthy)
    sessions: int = 0  # live sessions: open WebSockets and in-flight HTTP requests
    assigned: int = 0  # sessions ever bound here: the deterministic tie-break among equal loads
    drained_by_admin: bool = False  # POST /admin/workers/{id}/drain on this router replica
    speech_full: bool = False  # its last /ready said every speech stream slot was taken
    removed: bool = False  # left the source's snapshot; kept only while sessions are live

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def state(self) -> WorkerState:
        """The effective state: an admin drain overrides starting/ready, removal means gone."""
        if self.removed or self.spec.state is WorkerState.gone:
            return WorkerState.gone
        if self.drained_by_admin:
            return WorkerState.draining
        return self.spec.state

    @property
    def in_rotation(self) -> bool:
        """May receive new sessions: ready by its source, not drained, and passing /ready."""
        return self.state is WorkerState.ready and self.healthy

    @property
    def keeps_sessions(self) -> bool:
        """May receive follow-ups of sessions already bound to it (draining workers keep theirs)."""
        return self.state is not WorkerState.gone

    @property
    def idle(self) -> bool:
        return self.sessions == 0


@dataclass(frozen=True)
class TableChange:
    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()  # url, revision or state differs from the previous snapshot
    gone: tuple[str, ...] = ()  # became gone (by state or removal) and may have live sessions
    dropped: tuple[str, ...] = ()  # deleted from the table (gone and idle)


@dataclass
class WorkerTable:
    max_sessions_per_worker: int = 0  # 0 means no limit
    _workers: dict[str, Worker] = field(default_factory=dict)
    _ordered: list[Worker] | None = None  # the workers by id; rebuilt after a worker joins or leaves

    def apply(self, specs: Iterable[WorkerSpec]) -> TableChange:
        """Replace the source's view with a new complete snapshot; observed state is kept."""
        incoming = {spec.id: spec for spec in specs}
        added: list[str] = []
        changed: list[str] = []
        gone: list[str] = []
        dropped: list[str] = []
        for worker_id, spec in incoming.items():
            worker = self._workers.get(worker_id)
            if worker is None:
                self._workers[worker_id] = Worker(spec=spec)
                added.append(worker_id)
                continue
            was_gone = worker.state is WorkerState.gone
            if worker.spec != spec or worker.removed:
                if worker.spec.url != spec.url:
                    worker.healthy = False  # a new address must pass /ready again
                worker.spec = spec
                worker.removed = False
                changed.append(worker_id)
            if worker.state is WorkerState.gone and not was_gone:
                gone.append(worker_id)
        self._ordered = None
        for worker_id, worker in list(self._workers.items()):
            if worker_id in incoming:
                continue
            if worker.state is not WorkerState.gone:
                gone.append(worker_id)
            worker.removed = True
            if worker.idle:
                del self._workers[worker_id]
                dropped.append(worker_id)
        return TableChange(
            added=tuple(sorted(added)),
            changed=tuple(sorted(changed)),
            gone=tuple(sorted(gone)),
            dropped=tuple(sorted(dropped)),
        )

    def get(self, worker_id: str) -> Worker | None:
        return self._workers.get(worker_id)

    def _sorted(self) -> list[Worker]:
        if self._ordered is None:
            self._ordered = [self._workers[worker_id] for worker_id in sorted(self._workers)]
        return self._ordered

    def workers(self) -> list[Worker]:
        return list(self._sorted())

    def in_rotation(self) -> list[Worker]:
        return [worker for worker in self._sorted() if worker.in_rotation]

    def could_join_on_a_probe(self) -> bool:
        """Whether a health round could put a worker into rotation: one its source calls ready is
        failing /ready (draining and gone workers stay out whatever a probe says)."""
        return any(
            worker.state is WorkerState.ready and not worker.healthy for worker in self._workers.values()
        )

    def has_capacity(self, worker: Worker) -> bool:
        return self.max_sessions_per_worker <= 0 or worker.sessions < self.max_sessions_per_worker

    def set_health(self, worker_id: str, healthy: bool) -> bool:
        """Record a health result; True when it changed the worker's health."""
        worker = self._workers.get(worker_id)
        if worker is None or worker.healthy == healthy:
            return False
        worker.healthy = healthy
        return True

    def set_speech_full(self, worker_id: str, full: bool) -> None:
        worker = self._workers.get(worker_id)
        if worker is not None:
            worker.speech_full = full

    def drain(self, worker_id: str) -> Worker | None:
        worker = self._workers.get(worker_id)
        if worker is not None:
            worker.drained_by_admin = True
        return worker

    def undrain(self, worker_id: str) -> Worker | None:
        worker = self._workers.get(worker_id)
        if worker is not None:
            worker.drained_by_admin = False
        return worker

    def open_session(self, worker_id: str) -> None:
        worker = self._workers[worker_id]
        worker.sessions += 1
        worker.assigned += 1

    def close_session(self, worker_id: str) -> bool:
        """End one live session; True when the worker was gone and has now left the table."""
        worker = self._workers.get(worker_id)
        if worker is None:
            return False
        worker.sessions = max(0, worker.sessions - 1)
        if worker.removed and worker.idle:
            del self._workers[worker_id]
            self._ordered = None
            return True
        return False


def speech_full(ready_body: object) -> bool:
    """Whether a worker's /ready body says all its speech stream slots are taken (a limit of 0 is
    no limit; a body without the report, e.g. a text worker's or a peer runtime's, is not full)."""
    if not isinstance(ready_body, dict):
        return False
    report = ready_body.get("speech_streams")
    if not isinstance(report, dict):
        return False
    limit, in_use = report.get("limit"), report.get("in_use")
    if not isinstance(limit, int) or not isinstance(in_use, int) or isinstance(limit, bool):
        return False
    return limit > 0 and in_use >= limit
