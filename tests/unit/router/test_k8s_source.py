"""Worker Services (as the API server returns them) to worker specs, without a cluster."""

from __future__ import annotations

import pytest

from omni_runtime.router import k8s_source
from omni_runtime.router.k8s_source import workers_from_services
from omni_runtime.router.sources import WorkerTableError
from omni_runtime.router.table import WorkerSpec, WorkerState


def service(
    name: str, *, worker: str | None, revision: str = "rev1", state: str | None = "ready", url=None
) -> dict:
    labels = {"omni.dev/deployment": "tiny", "omni.dev/revision": revision}
    if worker:
        labels["omni.dev/worker"] = worker
    annotations = {}
    if state:
        annotations["omni.dev/worker-state"] = state
    if url:
        annotations["omni.dev/api-url"] = url
    return {"metadata": {"name": name, "namespace": "ml", "labels": labels, "annotations": annotations}}


def test_services_become_workers_sorted_by_id():
    services = [
        service("tiny-w1", worker="tiny-w1", state="draining"),
        service("tiny-router", worker=None),  # not a worker Service
        service("tiny-w0", worker="tiny-w0", state="starting"),
        service("tiny-w2", worker="tiny-w2", state=None, revision="rev2"),
        service("tiny-w3", worker="tiny-w3", url="http://worker.tiny-w3.ml.svc.cluster.local:8000"),
    ]
    assert workers_from_services(services, namespace="ml") == [
        WorkerSpec("tiny-w0", "http://api.tiny-w0.ml.svc.cluster.local:8000", "rev1", WorkerState.starting),
        WorkerSpec("tiny-w1", "http://api.tiny-w1.ml.svc.cluster.local:8000", "rev1", WorkerState.draining),
        WorkerSpec("tiny-w2", "http://api.tiny-w2.ml.svc.cluster.local:8000", "rev2", WorkerState.ready),
        WorkerSpec("tiny-w3", "http://worker.tiny-w3.ml.svc.cluster.local:8000", "rev1", WorkerState.ready),
    ]


def test_a_service_without_a_revision_is_rejected_with_its_name():
    bad = service("tiny-w0", worker="tiny-w0")
    del bad["metadata"]["labels"]["omni.dev/revision"]
    with pytest.raises(WorkerTableError) as caught:
        workers_from_services([bad], namespace="ml")
    assert str(caught.value) == "Service ml/tiny-w0.revision: required, a non-empty string"


def test_key_strings_match_the_operator():
    # The runtime may not import omni_operator; this test (outside the runtime) holds them in step.
    from omni_operator.api import labels

    assert k8s_source.DEPLOYMENT_LABEL == labels.DEPLOYMENT
    assert k8s_source.WORKER_LABEL == labels.WORKER
    assert k8s_source.REVISION_LABEL == labels.REVISION
    assert k8s_source.WORKER_STATE_ANNOTATION == labels.WORKER_STATE
