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
from dataclasses import dataclass
from typing import Any

import kopf

from omni_operator import k8s
from omni_operator.api import labels as keys
from omni_operator.api.spec import GROUP, PLURAL, VERSION
from omni_operator.reconcile.decide import decide
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
    debounce_seconds: float = 0.2


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
CHILD_FILTER = {keys.MANAGED_BY: keys.MANAGED_BY_VALUE, keys.DEPLOYMENT: kopf.PRESENT}


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Only warnings and errors become Kubernetes Events from kopf itself: no writes on success.
    settings.posting.level = logging.WARNING
    settings.persistence.finalizer = f"{keys.PREFIX}/kopf-finalizer"
    settings.peering.lifetime = OPTIONS.peering_lifetime
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    memo.kube = k8s.Kube.connect(OPTIONS.kubeconfig)
    if OPTIONS.peering_name and not settings.peering.standalone:
        for namespace in OPTIONS.peering_namespaces or (None,):
            memo.kube.ensure_peering(name=OPTIONS.peering_name, namespace=namespace)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def deployment_event(namespace: str, name: str, **_: Any) -> None:
    TRIGGERS.fire(namespace, name)


@kopf.on.event("v1", "pods", labels=CHILD_FILTER)
async def pod_event(namespace: str, labels: dict[str, str], **_: Any) -> None:
    TRIGGERS.fire(namespace, labels.get(keys.DEPLOYMENT))


@kopf.on.event("v1", "services", labels=CHILD_FILTER)
async def service_event(namespace: str, labels: dict[str, str], **_: Any) -> None:
    TRIGGERS.fire(namespace, labels.get(keys.DEPLOYMENT))


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def reconcile_loop(
    body: kopf.Body, namespace: str, name: str, stopped: kopf.DaemonStopped, memo: kopf.Memo, **_: Any
) -> None:
    trigger = TRIGGERS.get(namespace, name)
    failures = 0
    try:
        while not stopped:
            trigger.clear()
            snapshot = copy.deepcopy(dict(body))
            try:
                await asyncio.to_thread(reconcile_once, memo.kube, snapshot)
                failures, delay = 0, OPTIONS.resync_seconds
            except k8s.KubeError as exc:
                failures += 1
                delay = min(2.0**failures, 60.0)
                log.warning("reconcile %s/%s failed (retry in %.0f s): %s", namespace, name, delay, exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(trigger.wait(), timeout=delay)
            await asyncio.sleep(OPTIONS.debounce_seconds)  # let a burst of child events settle
    finally:
        TRIGGERS.drop(namespace, name)


def reconcile_once(kube: k8s.Kube, body: dict[str, Any]) -> None:
    """Observe, decide (pure), carry out, and log what it cost in API requests."""
    from omni_operator.render import render_manifests  # render/ is pure; imported once, lazily

    meta = body["metadata"]
    started, before = time.monotonic(), kube.counted()
    children = kube.list_children(namespace=meta["namespace"], deployment=meta["name"], uid=meta["uid"])
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    decision = decide(body=body, observed=Observed(tuple(children)), now=now, render=render_manifests)
    kube.carry_out(decision, body=body)
    cost = kube.counted() - before
    log.info(
        "reconcile %s/%s: %d reads, %d writes (%d applied, %d deleted, status %s) in %.0f ms",
        meta["namespace"],
        meta["name"],
        cost.reads,
        cost.writes,
        len(decision.apply),
        len(decision.delete),
        "patched" if decision.status is not None else "unchanged",
        (time.monotonic() - started) * 1000,
    )
