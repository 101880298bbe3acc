"""The worker table from Kubernetes: the headless Services the operator publishes, one per worker.

The operator labels each worker's Service with the deployment, worker and revision, and states the
worker's lifecycle in an annotation (starting|ready|draining). This module lists and watches those
Services in one namespace and turns them into WorkerSpecs. The mapping is a pure function
(`workers_from_services`) that tests call with plain dicts; the `kubernetes` client is imported
only inside `KubernetesSource`, so the router runs (and imports) without a cluster.

It also writes this replica's session reports on draining workers' Services (drain_reports.py
decides what; `report_sessions` merge-patches it from a thread), so the operator can end a drain
as soon as every router replica holds no session on the worker. The replica's name is $POD_NAME
(the downward API), else the hostname (a pod's hostname is its name).

The key strings repeat omni_operator.api.labels on purpose: the data plane never imports the
control plane (.importlinter), so the two sides share these strings by value. Keep them in step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypedDict

from omni_runtime.router.drain_reports import (
    DrainRow,
    Report,
    ReportPatch,
    report_key,
    reports_to_publish,
    still_draining,
)
from omni_runtime.router.sources import Apply, WorkerTableError, parse_worker
from omni_runtime.router.table import WorkerSpec

log = logging.getLogger("omni.router")

# Same values as omni_operator.api.labels (DEPLOYMENT, WORKER, REVISION, WORKER_STATE).
DEPLOYMENT_LABEL = "omni.dev/deployment"
WORKER_LABEL = "omni.dev/worker"
REVISION_LABEL = "omni.dev/revision"
WORKER_STATE_ANNOTATION = "omni.dev/worker-state"
DRAIN_STARTED_ANNOTATION = "omni.dev/drain-started"
# Router-specific: the operator may state the worker API URL outright (e.g. one-pod workers).
API_URL_ANNOTATION = "omni.dev/api-url"

WORKER_API_PORT = 8000
WATCH_SECONDS = 30  # server-side watch timeout: the thread re-checks for shutdown this often
REPORT_INTERVAL = 0.5  # seconds between session-report checks (a Service change wakes it sooner)


class ServiceMetadata(TypedDict, total=False):
    name: str
    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]


class ServiceObject(TypedDict, total=False):
    metadata: ServiceMetadata


def default_api_url(*, service: str, namespace: str, port: int = WORKER_API_PORT) -> str:
    """The builtin split layout: the worker's API pod has hostname `api` under its headless Service."""
    return f"http://api.{service}.{namespace}.svc.cluster.local:{port}"


def workers_from_services(services: Iterable[Mapping[str, Any]], *, namespace: str) -> list[WorkerSpec]:
    """WorkerSpecs from Service objects (dicts in the API's JSON shape), sorted by worker id.

    Services without the worker label are not workers (a deployment may have other Services) and
    are skipped. A missing state annotation means ready, as in the file source: the worker's own
    /ready still decides when it takes sessions, and the operator annotates starting or draining
    when it wants a worker held back.
    """
    specs: list[WorkerSpec] = []
    for service in services:
        metadata = service.get("metadata") or {}
        labels = metadata.get("labels") or {}
        annotations = metadata.get("annotations") or {}
        worker_id = labels.get(WORKER_LABEL)
        if not worker_id:
            continue
        name = metadata.get("name", worker_id)
        entry = {
            "id": worker_id,
            "url": annotations.get(API_URL_ANNOTATION) or default_api_url(service=name, namespace=namespace),
            "revision": labels.get(REVISION_LABEL, ""),
            "state": annotations.get(WORKER_STATE_ANNOTATION, "ready"),
        }
        specs.append(parse_worker(entry, where=f"Service {namespace}/{name}"))
    return sorted(specs, key=lambda spec: spec.id)


def drain_rows(services: Iterable[Mapping[str, Any]], *, key: str) -> list[DrainRow]:
    """The worker Services that say draining with a drain-started value, sorted by name."""
    rows: list[DrainRow] = []
    for service in services:
        metadata = service.get("metadata") or {}
        labels = metadata.get("labels") or {}
        annotations = metadata.get("annotations") or {}
        worker_id = labels.get(WORKER_LABEL)
        drain = annotations.get(DRAIN_STARTED_ANNOTATION)
        if not worker_id or annotations.get(WORKER_STATE_ANNOTATION) != "draining" or not drain:
            continue
        rows.append(
            DrainRow(
                service=metadata.get("name", worker_id),
                worker=worker_id,
                drain=drain,
                observed=annotations.get(key),
            )
        )
    return sorted(rows, key=lambda row: row.service)


def replica_name() -> str:
    return os.environ.get("POD_NAME") or socket.gethostname()


class KubernetesSource:
    """List, then watch, the worker Services of one OmniDeployment in one namespace."""

    def __init__(self, *, namespace: str, deployment: str, replica: str | None = None) -> None:
        self.namespace = namespace
        self.deployment = deployment
        self.selector = f"{DEPLOYMENT_LABEL}={deployment}"
        self.replica = replica or replica_name()
        self.report_key = report_key(self.replica)
        self._services: dict[str, dict[str, Any]] = {}
        self._resource_version: str | None = None
        self._api: Any = None
        self._stop = threading.Event()
        self._changed = asyncio.Event()  # set on the event loop after each snapshot is applied
        self._published: dict[str, Report] = {}  # Service name -> the report last written
        self._failures: set[tuple[str, str, int]] = set()  # (service, drain, status) already logged

    def describe(self) -> str:
        return f"Kubernetes Services {self.selector} in namespace {self.namespace}"

    def _core(self) -> Any:
        if self._api is None:
            from kubernetes import client, config  # the only import of the client in the runtime

            try:
                config.load_incluster_config()
            except config.ConfigException:
                try:
                    config.load_kube_config()
                except (config.ConfigException, FileNotFoundError, TypeError) as exc:
                    raise WorkerTableError(
                        f"--source kubernetes: no in-cluster service account and no usable kubeconfig ({exc})"
                    ) from None
            self._api = client.CoreV1Api()
        return self._api

    def _snapshot(self) -> list[WorkerSpec]:
        specs: list[WorkerSpec] = []
        for name, service in sorted(self._services.items()):
            try:
                specs.extend(workers_from_services([service], namespace=self.namespace))
            except WorkerTableError as exc:
                log.error("worker Service rejected", extra={"fields": {"service": name, "error": str(exc)}})
        return specs

    def _list(self) -> None:
        from kubernetes.client.exceptions import ApiException

        api = self._core()
        try:
            listing = api.list_namespaced_service(self.namespace, label_selector=self.selector)
        except ApiException as exc:
            raise WorkerTableError(
                f"--source kubernetes: cannot list Services in {self.namespace}: {exc.status} {exc.reason} "
                "(the router's service account needs get/list/watch on services)"
            ) from None
        serialize = api.api_client.sanitize_for_serialization
        self._services = {item.metadata.name: serialize(item) for item in listing.items}
        self._resource_version = listing.metadata.resource_version

    def load(self) -> list[WorkerSpec]:
        self._list()
        return self._snapshot()

    def _watch_thread(self, loop: asyncio.AbstractEventLoop, apply: Apply) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        api = self._core()
        serialize = api.api_client.sanitize_for_serialization
        while not self._stop.is_set():
            try:
                if self._resource_version is None:
                    self._list()
                    loop.call_soon_threadsafe(apply, self._snapshot())
                stream = watch.Watch().stream(
                    api.list_namespaced_service,
                    self.namespace,
                    label_selector=self.selector,
                    resource_version=self._resource_version,
                    timeout_seconds=WATCH_SECONDS,
                )
                for event in stream:
                    if self._stop.is_set():
                        return
                    obj = event["object"]
                    self._resource_version = obj.metadata.resource_version
                    if event["type"] == "DELETED":
                        self._services.pop(obj.metadata.name, None)
                    elif event["type"] in {"ADDED", "MODIFIED"}:
                        self._services[obj.metadata.name] = serialize(obj)
                    else:
                        continue
                    loop.call_soon_threadsafe(apply, self._snapshot())
            except ApiException as exc:
                if exc.status != 410:  # 410 Gone: our resource version expired; relist quietly
                    log.error("Service watch failed; relisting", extra={"fields": {"error": str(exc)}})
                    time.sleep(1.0)
                self._resource_version = None
            except Exception as exc:  # a dead watch thread would freeze the table silently: log, relist
                log.error("Service watch failed; relisting", extra={"fields": {"error": str(exc)}})
                self._resource_version = None
                time.sleep(1.0)

    async def watch(self, apply: Apply) -> None:
        # The client is synchronous: watch in a daemon thread (never blocking interpreter exit)
        # and hand snapshots to the event loop.
        loop = asyncio.get_running_loop()

        def apply_and_wake(specs: list[WorkerSpec]) -> None:
            apply(specs)
            self._changed.set()  # a drain may have started: report without waiting the interval

        thread = threading.Thread(
            target=self._watch_thread, args=(loop, apply_and_wake), name="k8s-watch", daemon=True
        )
        thread.start()
        try:
            await asyncio.Event().wait()
        finally:
            self._stop.set()

    # ---- session reports on draining workers ---------------------------------------------

    def _publish(self, patches: list[ReportPatch]) -> list[ReportPatch]:
        """Merge-patch each report onto its Service (runs in a worker thread); the ones written."""
        from kubernetes.client.exceptions import ApiException

        api = self._core()
        done: list[ReportPatch] = []
        for patch in patches:
            try:
                api.patch_namespaced_service(
                    patch.service,
                    self.namespace,
                    patch.body(),
                    _content_type="application/merge-patch+json",
                )
            except ApiException as exc:
                self._failed(patch, status=exc.status or 0, error=f"{exc.status} {exc.reason}")
                continue
            except Exception as exc:  # a network error must not end the report loop
                self._failed(patch, status=0, error=str(exc))
                continue
            done.append(patch)
            log.info(
                "session report written",
                extra={
                    "fields": {
                        "event": "drain_report",
                        "service": patch.service,
                        "drain": patch.report.drain,
                        "sessions": patch.report.sessions,
                    }
                },
            )
        return done

    def _failed(self, patch: ReportPatch, *, status: int, error: str) -> None:
        # Retried every interval; logged once per Service, drain and status so a missing right
        # (403: the router's Role needs patch on services) does not flood the log.
        seen = (patch.service, patch.report.drain, status)
        if status == 404 or seen in self._failures:
            return  # 404: the Service is gone, so is the drain
        self._failures.add(seen)
        fields = {"service": patch.service, "key": patch.key, "error": error}
        if status == 403:
            fields["fix"] = "the router's service account needs patch on services"
        log.error("cannot write the session report", extra={"fields": fields})

    async def report_sessions(
        self, live: Callable[[], Mapping[str, int]], *, interval: float = REPORT_INTERVAL
    ) -> None:
        """Keep this replica's reports on draining workers current until cancelled.

        `live()` gives live sessions by worker id; it is called on the event loop (the table's
        thread). The client is synchronous, so the patches go out from a worker thread.
        """
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=interval)
            self._changed.clear()
            # list() of a dict's values is one atomic step under the GIL; the watch thread may
            # replace entries meanwhile, and the next round sees its changes.
            rows = drain_rows(list(self._services.values()), key=self.report_key)
            self._published = still_draining(self._published, rows)
            patches = reports_to_publish(
                rows, sessions=live(), published=self._published, key=self.report_key
            )
            if not patches:
                continue
            for patch in await asyncio.to_thread(self._publish, patches):
                self._published[patch.service] = patch.report
