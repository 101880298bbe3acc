"""kopf glue, and nothing else: events become triggers, one reconcile loop runs per OmniDeployment.

Why a daemon per object rather than create/update handlers: reconcile here is level-triggered (it
looks at the whole world each time), bursts of child events should coalesce into one pass, and
kopf's change-detecting handlers write their own bookkeeping annotations after every change. A
daemon keeps all of that in memory: `on.event` handlers (for the OmniDeployment, its pods and its
services) set the object's trigger; the daemon waits for it (or the resync period), debounces,
and runs one reconcile in a worker thread. kopf's peering pauses the daemons of every replica but
the one with the highest priority, which is how several operator replicas elect one active.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import kopf

from omni_operator import k8s
from omni_operator.api import labels as keys
from omni_operator.api.spec import GROUP, PLURAL, VERSION
from omni_operator.reconcile.decide import decide, reconcile_error_decision
from omni_operator.reconcile.observe import Observed

log = logging.getLogger("omni.operator")


@dataclass
class Options:
    """Set by main.py before kopf starts; read by the startup handler."""

    kubeconfig: str | None = None
    peering_name: str | None = "omni-operator"
    peering_namespaces: tuple[str, ...] = ()  # empty: cluster-wide peering
    peering_lifetime: int = 60
    resync_seconds: float = 60.0
    full_resync_seconds: float = 300.0  # also re-list the rarely-changing kinds (StaticChildren)
    debounce_seconds: float = 0.2
    threads: int = 16


OPTIONS = Options()


class Triggers:
    """One asyncio.Event per OmniDeployment, set by watch events, awaited by its daemon."""

    def __init__(self) -> None:
        self._events: dict[tuple[str, str], asyncio.Event] = {}

    def get(self, namespace: str, name: str) -> asyncio.Event:
        return self._events.setdefault((namespace, name), asyncio.Event())

    def fire(self, namespace: str | None, name: str | None) -> None:
        if namespace and name:
            self.get(namespace, name).set()

    def drop(self, namespace: str, name: str) -> None:
        self._events.pop((namespace, name), None)


TRIGGERS = Triggers()
CHILD_FILTER: dict[str, Any] = {
    keys.MANAGED_BY: keys.MANAGED_BY_VALUE,
    keys.DEPLOYMENT: kopf.PRESENT,
}


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Only warnings and errors become Kubernetes Events from kopf itself: no writes on success.
    settings.posting.level = logging.WARNING
    settings.persistence.finalizer = f"{keys.PREFIX}/kopf-finalizer"
    settings.peering.lifetime = OPTIONS.peering_lifetime
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    # Reconciles wait on HTTP, not on the CPU: more threads than asyncio's default (cores + 4) let
    # many deployments reconcile at once.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=OPTIONS.threads))
    memo.kube = kube = await asyncio.to_thread(k8s.Kube.connect, OPTIONS.kubeconfig)
    if OPTIONS.peering_name and not settings.peering.standalone:
        for namespace in OPTIONS.peering_namespaces or (None,):
            await asyncio.to_thread(kube.ensure_peering, name=OPTIONS.peering_name, namespace=namespace)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def deployment_event(namespace: str | None, name: str, **_: Any) -> None:
    TRIGGERS.fire(namespace, name)


@kopf.on.event("v1", "pods", labels=CHILD_FILTER)
async def pod_event(namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
    TRIGGERS.fire(namespace, labels.get(keys.DEPLOYMENT))


@kopf.on.event("v1", "services", labels=CHILD_FILTER)
async def service_event(namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
    TRIGGERS.fire(namespace, labels.get(keys.DEPLOYMENT))


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def reconcile_loop(
    body: kopf.Body, namespace: str | None, name: str, stopped: kopf.DaemonStopped, memo: Any, **_: Any
) -> None:
    namespace = namespace or ""  # OmniDeployments are namespaced; kopf's type allows None
    trigger = TRIGGERS.get(namespace, name)
    static = StaticChildren()
    failures = 0
    try:
        while not stopped:
            trigger.clear()
            snapshot = copy.deepcopy(dict(body))
            try:
                requeue = await asyncio.to_thread(reconcile_once, memo.kube, snapshot, static)
                failures, delay = 0, min(OPTIONS.resync_seconds, requeue or OPTIONS.resync_seconds)
            except Exception as exc:  # the daemon outlives any one pass; CancelledError is not caught
                static.items = None  # the failed pass may have written some of them
                failures += 1
                delay = retry_delay(failures)
                if isinstance(exc, k8s.KubeError):
                    log.warning("reconcile %s/%s failed (retry in %.0f s): %s", namespace, name, delay, exc)
                else:  # a bug (renderer, spec model): its traceback once, and the status says so
                    log.exception("reconcile %s/%s raised (retry in %.0f s)", namespace, name, delay)
                    await asyncio.to_thread(report_reconcile_error, memo.kube, snapshot, exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(trigger.wait(), timeout=delay)
            await asyncio.sleep(OPTIONS.debounce_seconds)  # let a burst of child events settle
    finally:
        TRIGGERS.drop(namespace, name)


def retry_delay(failures: int) -> float:
    """Seconds before retrying after `failures` failed passes in a row: 2, 4, 8, ... up to 60."""
    return min(2.0**failures, 60.0)


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def report_reconcile_error(kube: k8s.Kube, body: dict[str, Any], error: Exception) -> None:
    """Best effort: the OmniDeployment's status names the exception (Ready False, ReconcileError)
    until a pass succeeds. A failure to write it is logged, never raised: the loop retries anyway."""
    meta = body.get("metadata", {})
    try:
        decision = reconcile_error_decision(body=body, error=error, now=utc_now())
        kube.scoped().carry_out(decision, body=body)
    except Exception as exc:
        log.warning("reconcile %s/%s: status not written: %s", meta.get("namespace"), meta.get("name"), exc)


@dataclass
class StaticChildren:
    """One deployment's children of STATIC_KINDS, re-listed only when they may have changed."""

    items: list[dict[str, Any]] | None = None
    generation: int | None = None
    listed_at: float = 0.0

    def stale(self, generation: int | None, *, full_resync_seconds: float) -> bool:
        return (
            self.items is None
            or generation != self.generation
            or time.monotonic() - self.listed_at > full_resync_seconds
        )


def reconcile_once(
    kube: k8s.Kube, body: dict[str, Any], static: StaticChildren | None = None
) -> float | None:
    """Observe, decide (pure), carry out, and log what it cost in API requests. Returns when to look
    again regardless of events (a rollout's drain or progress deadline), in seconds, or None."""
    from omni_operator.render import render_manifests  # render/ is pure; imported once, lazily

    static = static if static is not None else StaticChildren()
    meta = body["metadata"]
    kube = kube.scoped()
    started = time.monotonic()
    scope = {"namespace": meta["namespace"], "deployment": meta["name"], "uid": meta["uid"]}
    children = kube.list_children(**scope, kinds=k8s.WATCHED_KINDS)
    if static.stale(meta.get("generation"), full_resync_seconds=OPTIONS.full_resync_seconds):
        static.items = kube.list_children(**scope, kinds=k8s.STATIC_KINDS)
        static.generation, static.listed_at = meta.get("generation"), time.monotonic()
    assert static.items is not None
    now = utc_now()
    observed = Observed(tuple(children + static.items))
    decision = decide(body=body, observed=observed, now=now, render=render_manifests)
    kube.carry_out(decision, body=body)
    watched = {kind for _, kind in k8s.WATCHED_KINDS}
    if any(m["kind"] not in watched for m in decision.apply) or any(
        k.kind not in watched for k in decision.delete
    ):
        static.items = None  # what we just wrote is not in the cache: list it again next time
    cost = kube.counted()
    log.info(
        "reconcile %s/%s: %d reads, %d writes (%d applied, %d deleted, %d annotated, status %s) in %.0f ms",
        meta["namespace"],
        meta["name"],
        cost.reads,
        cost.writes,
        len(decision.apply),
        len(decision.delete),
        len(decision.annotate),
        "patched" if decision.status is not None else "unchanged",
        (time.monotonic() - started) * 1000,
    )
    return decision.requeue_after
