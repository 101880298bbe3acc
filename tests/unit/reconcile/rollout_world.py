"""A small imagined cluster for rollout walks: decide's writes land in it, kwok-like pods turn ready
on the next pass, deletes take one pass to finish, and a clock moves by one second per pass."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from omni_operator.api import labels
from omni_operator.reconcile.decide import Decision, decide
from omni_operator.reconcile.observe import Observed
from omni_operator.render import render_manifests

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def stamp(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


class World:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body = copy.deepcopy(body)
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.clock = START
        self.log: list[Decision] = []

    @property
    def now(self) -> str:
        return stamp(self.clock)

    def set_spec(self, **changes: Any) -> None:
        self.body["spec"] = {**self.body["spec"], **changes}
        self.body["metadata"]["generation"] += 1

    def pass_(self, *, seconds: float = 1.0) -> Decision:
        """One reconcile, then the cluster moves: terminating objects vanish, pods turn ready."""
        d = decide(
            body=self.body,
            observed=Observed(tuple(self.objects.values())),
            now=self.now,
            render=render_manifests,
        )
        self.log.append(d)
        self._settle()
        self._carry_out(d)
        if d.status is not None:
            status = {k: v for k, v in {**self.body.get("status", {}), **d.status}.items() if v is not None}
            self.body["status"] = status
        self.clock += dt.timedelta(seconds=seconds)
        return d

    def _settle(self) -> None:
        for key, obj in list(self.objects.items()):
            if obj["metadata"].get("deletionTimestamp"):
                del self.objects[key]
            elif obj["kind"] == "Pod" and self.schedulable(obj):
                obj["status"] = {
                    "phase": "Running",
                    "startTime": self.now,
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "containerStatuses": [{"name": "c", "restartCount": 0}],
                }

    def schedulable(self, pod: dict[str, Any]) -> bool:
        return not (pod["spec"].get("nodeSelector") or {}).get("nowhere")

    def _carry_out(self, d: Decision) -> None:
        for key in d.delete:
            if (key.kind, key.name) in self.objects:
                self.objects[(key.kind, key.name)]["metadata"]["deletionTimestamp"] = self.now
        for m in d.apply:
            out = copy.deepcopy(m)
            old = self.objects.get((m["kind"], m["metadata"]["name"]))
            if old is not None:  # server-side apply keeps what others wrote (merge-patched annotations)
                kept = {k: v for k, v in (old["metadata"].get("annotations") or {}).items()}
                out["metadata"]["annotations"] = {**kept, **(out["metadata"].get("annotations") or {})}
                out["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"]
                out["status"] = old.get("status", {})
            else:
                out["metadata"]["creationTimestamp"] = self.now
                if out["kind"] == "Pod":
                    out["status"] = {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]}
            self.objects[(m["kind"], m["metadata"]["name"])] = out
        for patch in d.annotate:
            obj = self.objects.get((patch.key.kind, patch.key.name))
            if obj is None:
                continue
            annotations = obj["metadata"].setdefault("annotations", {})
            for k, v in patch.annotations.items():
                if v is None:
                    annotations.pop(k, None)
                else:
                    annotations[k] = v

    def workers(self) -> dict[str, str]:
        """worker -> 'revision-prefix:state' from the worker Services, as the router reads them."""
        rev = {}
        for (kind, name), obj in sorted(self.objects.items()):
            lbls = obj["metadata"].get("labels") or {}
            if kind == "Service" and lbls.get(labels.COMPONENT) == "worker":
                state = (obj["metadata"].get("annotations") or {}).get(labels.WORKER_STATE)
                rev[name] = f"{lbls[labels.REVISION][:4]}:{state}"
        return rev

    def pods(self) -> dict[str, str]:
        return {
            name: obj["metadata"]["annotations"].get(labels.POD_REVISION, "")[:4]
            + ("(x)" if obj["metadata"].get("deletionTimestamp") else "")
            for (kind, name), obj in sorted(self.objects.items())
            if kind == "Pod"
        }
