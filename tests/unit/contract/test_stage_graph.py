"""The one stage graph (omni_runtime.contract.stages), and that the planner and the runtime use it."""

from __future__ import annotations

import pytest

from omni_operator.api.spec import OmniDeployment
from omni_operator.plan import plan_deployment
from omni_runtime.contract.engine import EngineError
from omni_runtime.contract.options import EngineOptions
from omni_runtime.contract.stages import EDGES, HOSTABLE, REMOTABLE, VARIANTS, Stage, edges_among
from omni_runtime.pipeline.graph import local_stages

S = Stage
TEXT = (S.preprocessing, S.audio_encoder, S.image_encoder, S.mm_aggregate, S.thinker, S.decode)
TEXT_EDGES = (
    (S.preprocessing, S.audio_encoder),
    (S.preprocessing, S.image_encoder),
    (S.preprocessing, S.mm_aggregate),
    (S.audio_encoder, S.mm_aggregate),
    (S.image_encoder, S.mm_aggregate),
    (S.mm_aggregate, S.thinker),
    (S.thinker, S.decode),
)
# variant -> (stages, edges), exactly.
GRAPH = {
    "text": (TEXT, TEXT_EDGES),
    "speech": ((*TEXT, S.talker), (*TEXT_EDGES, (S.thinker, S.talker))),
    "streaming-speech": (
        (*TEXT, S.talker, S.segmenter, S.talker_stream),
        (*TEXT_EDGES, (S.thinker, S.talker), (S.talker, S.segmenter), (S.segmenter, S.talker_stream)),
    ),
    # streaming speech's graph; its realtime sessions are full duplex by default
    "duplex": (
        (*TEXT, S.talker, S.segmenter, S.talker_stream),
        (*TEXT_EDGES, (S.thinker, S.talker), (S.talker, S.segmenter), (S.segmenter, S.talker_stream)),
    ),
}


@pytest.mark.parametrize("variant", sorted(GRAPH))
def test_variant_stages_and_edges(variant: str) -> None:
    stages, edges = GRAPH[variant]
    assert VARIANTS[variant] == stages
    assert edges_among(stages) == edges


def test_where_stages_may_run() -> None:
    assert set(VARIANTS) == set(GRAPH)
    assert (
        S.preprocessing,
        S.audio_encoder,
        S.image_encoder,
        S.mm_aggregate,
        S.thinker,
        S.talker,
    ) == REMOTABLE
    assert (*REMOTABLE, S.talker_stream) == HOSTABLE
    assert all(a in VARIANTS["streaming-speech"] and b in VARIANTS["streaming-speech"] for a, b in EDGES)


def _deployment(pipeline: str, *, gpu: bool) -> OmniDeployment:
    spec: dict[str, object] = {"model": {"name": "Qwen2.5-Omni-7B"}, "pipeline": pipeline}
    if not gpu:
        spec["gpu"] = {"tier": "cpu"}
        spec["model"] = {"name": "tiny-omni", "source": {"type": "tiny"}}
    return OmniDeployment.model_validate({"metadata": {"name": "g"}, "spec": spec})


@pytest.mark.parametrize("variant", sorted(GRAPH))
@pytest.mark.parametrize("gpu", [False, True], ids=["one-pod", "split-pods"])
def test_the_planner_derives_its_graph_and_pods_from_the_contract(variant: str, gpu: bool) -> None:
    plan = plan_deployment(_deployment(variant, gpu=gpu))
    stages, edges = GRAPH[variant]
    assert (plan.stages, plan.edges) == (stages, edges)
    pods = plan.workers[0].pods
    # Every stage is hosted by exactly one pod, and what a stage pod hosts an `omni stage` accepts.
    assert sorted(s for pod in pods for s in pod.stages) == sorted(stages)
    engine = [p for p in pods if "--remote-stage" in p.container.command or len(pods) == 1]
    assert len(engine) == 1
    command = engine[0].container.command
    remote = dict(command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--remote-stage")
    # The runtime accepts the engine pod's --remote-stage flags and hosts exactly the pod's stages.
    options = EngineOptions(pipeline=variant, remote_stages=remote)
    assert local_stages(options) == frozenset(engine[0].stages)
    for pod in pods:
        if pod is not engine[0]:
            assert set(pod.stages) <= set(HOSTABLE)


@pytest.mark.parametrize(
    ("remote", "message"),
    [
        ({"segmenter": "h:1"}, "stage 'segmenter' cannot run remotely"),
        ({"talker_stream": "h:1"}, "stage 'talker_stream' cannot run remotely"),
        ({"decode": "h:1"}, "stage 'decode' cannot run remotely"),
    ],
)
def test_engine_local_stages_cannot_be_remote(remote: dict[str, str], message: str) -> None:
    with pytest.raises(EngineError, match=message):
        local_stages(EngineOptions(pipeline="streaming-speech", remote_stages=remote))
