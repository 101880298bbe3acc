"""Revisions: short hashes of worker and pod templates.

A worker's revision changes when anything that shapes it changes (model, runtime, pipeline, stages,
GPUs, media) and never when only the worker count, router or rollout settings do; a pod's revision
changes only when that pod's own template does, so a rollout can tell which roles really changed.
"""

from __future__ import annotations

import hashlib
import json

from omni_operator.api.spec import MediaSpec, OmniDeploymentSpec, SessionKVSpec, SpeechSpec
from omni_operator.api.streaming_input import StreamingInputSpec
from omni_operator.plan.types import StagePod


def _digest(payload: object) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def worker_revision(spec: OmniDeploymentSpec) -> str:
    """Hash of everything that shapes a worker; workers count, router and rollout are left out.

    spec.media, spec.streamingInput, spec.speech, spec.sessionKv and spec.runtime.env count only when set, so a
    deployment that leaves them alone keeps the revision it had before the fields existed (an operator
    upgrade does not roll its workers).
    """
    shaping = {"model", "runtime", "pipeline", "stages", "gpu"}
    unset = {} if spec.runtime.env else {"runtime": {"env"}}
    if spec.media != MediaSpec():
        shaping.add("media")
    if spec.streaming_input != StreamingInputSpec():
        shaping.add("streaming_input")
    if spec.speech != SpeechSpec():
        shaping.add("speech")
    if spec.session_kv != SessionKVSpec():
        shaping.add("session_kv")
    return _digest(spec.model_dump(mode="json", by_alias=True, include=shaping, exclude=unset))


def pod_revision(pod: StagePod, *, worker: str, revision: str) -> str:
    """Hash of one pod's template, the same for that role in every worker of one revision.

    The worker name and the worker revision (passed as --revision) are masked, so a change that
    leaves this pod's template alone leaves its revision alone too.
    """

    def mask(text: str) -> str:
        return text.replace(revision, "{revision}").replace(worker, "{worker}")

    container = pod.container
    dumped = container.model_dump(mode="json")
    for key in ("startup_s", "probe_timeout_s"):  # unset: the pod keeps the revision it had before them
        if dumped[key] is None:
            del dumped[key]
    payload = {
        "role": pod.role.value,
        "stages": [s.value for s in pod.stages],
        "logical_gpus": list(pod.logical_gpus),
        "node_rank": pod.node_rank,
        "nnodes": pod.nnodes,
        "container": dumped
        | {
            "command": [mask(a) for a in container.command],
            "env": {k: mask(v) for k, v in container.env.items()},
        },
    }
    return _digest(payload)
