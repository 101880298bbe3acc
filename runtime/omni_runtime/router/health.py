"""Active health checks: a worker is in rotation only while its /ready answers 200.

A worker's /ready is 200 only when every stage, local and remote, is loaded and warmed up, so one
probe covers the whole worker. Its body also reports the speech streams in use against the limit;
a worker with none free is ranked last for new sessions until a later probe says otherwise. Each round probes every worker concurrently; a failed probe takes
the worker out of rotation at once and the next 200 puts it back. The proxies also report
connection errors here (`mark_down`), so a dead worker leaves rotation before the next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import httpx

from omni_runtime.router.table import WorkerState, WorkerTable, speech_full

log = logging.getLogger("omni.router")

RECHECK_WAIT_S = 0.5
RECHECK_FRESH_S = 0.05


class HealthChecker:
    def __init__(self, table: WorkerTable, *, interval: float, timeout: float | None = None) -> None:
        self.table = table
        self.interval = interval
        # Generous: a worker busy generating on a loaded CPU may answer /ready slowly and is still
        # serving; a dead one refuses the connection at once and leaves rotation without waiting.
        self.timeout = timeout if timeout is not None else max(2.0, interval)
        self._client = httpx.AsyncClient(timeout=self.timeout, trust_env=False)
        self._wake = asyncio.Event()
        self._round: asyncio.Future[None] | None = None
        self._round_done_at = float("-inf")

    async def aclose(self) -> None:
        if self._round is not None and not self._round.done():
            self._round.cancel()
            await asyncio.gather(self._round, return_exceptions=True)
        await self._client.aclose()

    def poke(self) -> None:
        """Run a round now (a worker joined or changed) instead of waiting for the interval."""
        self._wake.set()

    def _record(self, worker_id: str, healthy: bool, detail: str) -> None:
        if self.table.set_health(worker_id, healthy):
            worker = self.table.get(worker_id)
            log.info(
                "worker entered rotation" if healthy else "worker left rotation",
                extra={
                    "fields": {
                        "event": "worker_health",
                        "worker": worker_id,
                        "healthy": healthy,
                        "detail": detail,
                        "state": worker.state.value if worker else None,
                    }
                },
            )

    def mark_down(self, worker_id: str, detail: str) -> None:
        self._record(worker_id, False, detail)
        self.poke()

    async def _probe(self, worker_id: str, url: str) -> None:
        try:
            response = await self._client.get(f"{url}/ready")
        except httpx.HTTPError as exc:
            self._record(worker_id, False, f"/ready failed: {type(exc).__name__}")
            return
        healthy = response.status_code == 200
        if healthy:
            try:
                body = response.json()
            except ValueError:
                body = None
            self.table.set_speech_full(worker_id, speech_full(body))
        self._record(worker_id, healthy, f"/ready {response.status_code}")

    async def check_once(self) -> None:
        probes = [
            self._probe(worker.id, worker.url)
            for worker in self.table.workers()
            if worker.state is not WorkerState.gone
        ]
        await asyncio.gather(*probes)
        self._round_done_at = time.monotonic()

    async def recheck(self, *, wait: float = RECHECK_WAIT_S, fresh: float = RECHECK_FRESH_S) -> None:
        """A round now, for a request that found no worker in rotation, so that it is refused only on
        news, not on a round up to `interval` old: a worker may have become ready since (each replica
        of `omni router --processes N` probes on its own timer; one can already route to a worker that
        another still has as starting). Concurrent callers share one round; none waits more than
        `wait` seconds for it (a hung worker's probe lasts `timeout`); a round that ended within
        `fresh` seconds is news enough."""
        if time.monotonic() - self._round_done_at < fresh:
            return
        if self._round is None or self._round.done():
            self._round = asyncio.ensure_future(self.check_once())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._round), timeout=wait)

    async def run(self) -> None:
        while True:
            self._wake.clear()
            await self.check_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.interval)
