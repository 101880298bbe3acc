"""Self-heal decisions: which pods to recreate because something inside a worker broke.

A worker is one pipeline; its thinker ranks form one tensor-parallel group. When a thinker rank
fails, the group cannot continue with a fresh rank joining half-way, so the whole worker is
recreated (as LeaderWorkerSet's RecreateGroupOnPodRestart does). A failed pod that hosts no thinker
(api, talker, dedicated vision) is recreated alone: its peers reconnect through their stage links.
A deleted pod needs no decision here: it is simply missing, and the diff creates it again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from omni_operator.plan.types import Stage, WorkerPlan
from omni_operator.reconcile.observe import PodView


@dataclass(frozen=True)
class Heal:
    worker: str
    pods: tuple[str, ...]
    """Pod names to delete (they are created again from the plan once gone)."""
    whole_worker: bool
    message: str


def _thinker_rank_broken(pod: PodView, *, nnodes: int) -> str | None:
    if pod.terminating:
        return None
    if pod.phase == "Failed":
        return f"thinker pod {pod.name} failed: {pod.failure}"
    # A restarted rank of a multi-pod group has left its NCCL group for good.
    if nnodes > 1 and pod.restarts > 0:
        return f"thinker rank pod {pod.name} restarted ({pod.restarts}x) and left its tensor-parallel group"
    return None


def heal_decisions(*, workers: Iterable[WorkerPlan], pods: Iterable[PodView]) -> tuple[Heal, ...]:
    by_name = {p.name: p for p in pods}
    out: list[Heal] = []
    for worker in workers:
        present = [by_name[p.name] for p in worker.pods if p.name in by_name]
        live = tuple(p.name for p in present if not p.terminating)
        thinker_pods = [p for p in worker.pods if Stage.thinker in p.stages]
        nnodes = max((p.nnodes for p in thinker_pods), default=1)
        reason = None
        for planned in thinker_pods:
            view = by_name.get(planned.name)
            if view is not None:
                reason = _thinker_rank_broken(view, nnodes=nnodes)
            elif nnodes > 1 and any(
                by_name[o.name].started for o in thinker_pods if o.name in by_name and o is not planned
            ):
                # A rank vanished while its peers already run: the group is broken.
                reason = f"thinker rank pod {planned.name} is gone while its peers run"
            if reason:
                break
        if reason and live:
            out.append(Heal(worker=worker.name, pods=live, whole_worker=True, message=reason))
            continue
        for view in present:
            if view.phase == "Failed" and not view.terminating:
                out.append(
                    Heal(
                        worker=worker.name,
                        pods=(view.name,),
                        whole_worker=False,
                        message=f"pod {view.name} failed: {view.failure}",
                    )
                )
    return tuple(out)
