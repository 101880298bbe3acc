"""The only module that talks to the Kubernetes API server.

Reconcile decisions (reconcile/) are pure; this module reads the world they need (the children of one
OmniDeployment, by label and controller owner) and carries a Decision out: server-side apply with one
field manager (omni-operator, conflicts forced: the operator owns its children), deletes with
background propagation, a status merge-patch only when the status changed, and Events. Every request
is counted, so a reconcile can report how many reads and writes it cost (idle reconciles: 0 writes).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from omni_operator.api import labels
from omni_operator.api.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION
from omni_operator.reconcile.decide import Decision
from omni_operator.reconcile.events import EventSpec
from omni_operator.reconcile.observe import ChildKey, Manifest, controlled_by

log = logging.getLogger("omni.operator.k8s")

PLURALS: dict[str, str] = {
    "Pod": "pods",
    "Service": "services",
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "ServiceAccount": "serviceaccounts",
    "Deployment": "deployments",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "NetworkPolicy": "networkpolicies",
    "Role": "roles",
    "RoleBinding": "rolebindings",
}

WATCHED_KINDS: tuple[tuple[str, str], ...] = (("v1", "Pod"), ("v1", "Service"))
"""Kinds the operator watches (handlers.py): listed on every reconcile."""

STATIC_KINDS: tuple[tuple[str, str], ...] = (
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("v1", "ConfigMap"),
    ("apps/v1", "Deployment"),
    ("policy/v1", "PodDisruptionBudget"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
)
"""The other kinds render/ produces: they change only when the spec does, so they are listed on a
spec change, after the operator wrote one of them, and on the slow full resync."""

CHILD_KINDS = WATCHED_KINDS + STATIC_KINDS

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"


class KubeError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        self.status = status
        try:
            message = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            message = body
        self.message = message
        super().__init__(f"{method} {path}: {status} {message}")


def collection_path(api_version: str, kind: str, namespace: str | None) -> str:
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    plural = PLURALS.get(kind, kind)
    return f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"


def deployment_path(namespace: str, name: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"


class NoCredentialsError(ValueError):
    """Neither in-cluster credentials nor a usable kubeconfig: the operator has no cluster to talk to."""


@dataclass
class RequestCount:
    reads: int = 0
    writes: int = 0


class Kube:
    """A thin, counted REST layer over the official client's configuration and connection pool."""

    def __init__(self, api: k8s_client.ApiClient, *, timeout: float = 30.0) -> None:
        self.api = api
        self.timeout = timeout
        self._count = RequestCount()
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, kubeconfig: str | None = None) -> Kube:
        """In-cluster credentials when running in a pod, else the kubeconfig ($KUBECONFIG, ~/.kube);
        NoCredentialsError when neither is there (the message names both and the fix)."""
        configuration = k8s_client.Configuration()
        try:
            if kubeconfig:
                raise k8s_config.ConfigException("kubeconfig given")
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            try:
                k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
            except (k8s_config.ConfigException, OSError, ValueError, yaml.YAMLError) as err:
                where = f"--kubeconfig {kubeconfig}" if kubeconfig else "$KUBECONFIG or ~/.kube/config"
                why = " ".join(str(err).split()).rstrip(".")  # one line, also for a YAML parser's report
                raise NoCredentialsError(
                    f"no Kubernetes credentials: not in a pod with a service account, and {where}: {why}; "
                    "run the operator in the cluster (helm install) or point --kubeconfig at a cluster's kubeconfig"
                ) from err
        return cls(k8s_client.ApiClient(configuration))

    def scoped(self) -> Kube:
        """The same connection pool with its own request count (one per reconcile: they run in
        parallel threads, so a shared count would mix them)."""
        return Kube(self.api, timeout=self.timeout)

    def counted(self) -> RequestCount:
        with self._lock:
            return RequestCount(self._count.reads, self._count.writes)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any] | None:
        """One HTTP request; returns the decoded JSON, None for 404, raises KubeError otherwise."""
        with self._lock:
            if method == "GET":
                self._count.reads += 1
            else:
                self._count.writes += 1
        headers = {"Accept": "application/json", "Content-Type": content_type}
        _, url, headers, _, _ = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params=headers,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(
            method, url, header_params=headers, body=body, _request_timeout=self.timeout
        )
        data = response.read()
        if response.status == 404:
            return None
        if response.status >= 400:
            raise KubeError(response.status, method, path, data.decode(errors="replace"))
        return json.loads(data) if data else {}

    # --- reads ---------------------------------------------------------------------------------

    def get_deployment(self, namespace: str, name: str) -> Manifest | None:
        return self.request("GET", deployment_path(namespace, name))

    def list_children(
        self, *, namespace: str, deployment: str, uid: str, kinds: Iterable[tuple[str, str]] = CHILD_KINDS
    ) -> list[Manifest]:
        """Children of one OmniDeployment: its label, and it as their controller owner."""
        selector = f"{labels.DEPLOYMENT}={deployment},{labels.MANAGED_BY}={labels.MANAGED_BY_VALUE}"
        out: list[Manifest] = []
        for api_version, kind in kinds:
            found = self.request(
                "GET", collection_path(api_version, kind, namespace), query={"labelSelector": selector}
            )
            for item in (found or {}).get("items", []):
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
                if controlled_by(item, uid):
                    out.append(item)
        return out

    # --- writes --------------------------------------------------------------------------------

    def apply(self, manifest: Manifest, *, namespace: str) -> Manifest | None:
        path = f"{collection_path(manifest['apiVersion'], manifest['kind'], namespace)}/{manifest['metadata']['name']}"
        return self.request(
            "PATCH",
            path,
            query={"fieldManager": labels.FIELD_MANAGER, "force": "true"},
            body=manifest,
            content_type=APPLY,
        )

    def delete(self, key: ChildKey, *, namespace: str) -> None:
        path = f"{collection_path(key.api_version, key.kind, namespace)}/{key.name}"
        self.request("DELETE", path, body={"propagationPolicy": "Background"})

    def annotate(self, key: ChildKey, annotations: dict[str, str | None], *, namespace: str) -> None:
        """Merge-patch annotations (None removes one); a child gone meanwhile is not an error."""
        path = f"{collection_path(key.api_version, key.kind, namespace)}/{key.name}"
        self.request(
            "PATCH",
            path,
            query={"fieldManager": labels.FIELD_MANAGER},
            body={"metadata": {"annotations": annotations}},
            content_type=MERGE,
        )

    def patch_status(self, *, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.request(
            "PATCH", deployment_path(namespace, name) + "/status", body={"status": status}, content_type=MERGE
        )

    def post_event(self, *, owner: Manifest, event: EventSpec, component: str = "omni-operator") -> None:
        meta = owner["metadata"]
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.request(
            "POST",
            collection_path("v1", "events", meta["namespace"]),
            body={
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {
                    "apiVersion": API_VERSION,
                    "kind": KIND,
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta.get("uid"),
                },
                "type": event.type,
                "reason": event.reason,
                "message": event.message[:1024],
                "source": {"component": component},
                "reportingComponent": component,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            },
        )

    def carry_out(self, decision: Decision, *, body: Manifest) -> None:
        """Deletes first (a replaced pod must go before its successor can be created), then applies,
        then annotation patches (a worker's drain), then status, then events. Each step is idempotent,
        so a crash half-way is repaired by the next reconcile without duplicates (children have fixed
        names, and the rollout re-decides from what it finds)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        for key in decision.delete:
            self.delete(key, namespace=namespace)
        for manifest in decision.apply:
            self.apply(manifest, namespace=namespace)
        for patch in decision.annotate:
            self.annotate(patch.key, patch.annotations, namespace=namespace)
        if decision.status is not None:
            self.patch_status(namespace=namespace, name=name, status=decision.status)
        for event in decision.events:
            try:
                self.post_event(owner=body, event=event)
            except KubeError as exc:  # an event is best effort; never fail a reconcile for it
                log.warning("event %s not posted: %s", event.reason, exc)

    # --- peering (leader election among operator replicas) ----------------------------------------

    def ensure_peering(self, *, name: str, namespace: str | None) -> None:
        """Create kopf's peering object if missing (its CRDs come with the chart: PEERING_CRDS)."""
        kind, plural = (
            ("KopfPeering", "kopfpeerings") if namespace else ("ClusterKopfPeering", "clusterkopfpeerings")
        )
        path = (
            f"/apis/kopf.dev/v1/namespaces/{namespace}/{plural}"
            if namespace
            else f"/apis/kopf.dev/v1/{plural}"
        )
        if self.request("GET", f"{path}/{name}") is not None:
            return
        try:
            self.request(
                "POST", path, body={"apiVersion": "kopf.dev/v1", "kind": kind, "metadata": {"name": name}}
            )
        except KubeError as exc:
            if exc.status != 409:  # created by another replica meanwhile
                raise


def _peering_crd(kind: str, plural: str, scope: str) -> Manifest:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.kopf.dev"},
        "spec": {
            "scope": scope,
            "group": "kopf.dev",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                            },
                        }
                    },
                }
            ],
        },
    }


PEERING_CRDS: tuple[Manifest, ...] = (
    _peering_crd("ClusterKopfPeering", "clusterkopfpeerings", "Cluster"),
    _peering_crd("KopfPeering", "kopfpeerings", "Namespaced"),
)
"""kopf's peering CRDs (as in kopf's docs), for the Helm chart and the e2e fixture."""
