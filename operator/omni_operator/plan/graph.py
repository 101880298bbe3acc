"""Stage graphs of the pipeline variants.

One place says which stages a variant runs and how data flows between them, so the planner, the
renderer's annotations and the runtime's stage wiring agree. Graph order is the order stages are
listed everywhere (pods' --stages, annotations, --remote-stage flags).
"""

from __future__ import annotations

from omni_operator.api.spec import OmniDeploymentSpec, PipelineVariant
from omni_operator.plan.types import Stage

GRAPH_ORDER: tuple[Stage, ...] = tuple(Stage)


def pipeline_stages(spec: OmniDeploymentSpec, *, talker: bool) -> tuple[Stage, ...]:
    """Stages of the spec's variant: text has no talker; streaming-speech adds segmenter and talker_stream."""
    stages = {Stage.preprocessing, Stage.image_encoder, Stage.mm_aggregate, Stage.thinker, Stage.decode}
    if spec.stages.audio_encoder.enabled:
        stages.add(Stage.audio_encoder)
    if talker:
        stages.add(Stage.talker)
    if spec.pipeline is PipelineVariant.streaming_speech:
        stages |= {Stage.segmenter, Stage.talker_stream}
    return tuple(s for s in GRAPH_ORDER if s in stages)


def pipeline_edges(stages: tuple[Stage, ...]) -> tuple[tuple[Stage, Stage], ...]:
    """Data flow: encoders feed mm_aggregate, the thinker feeds decode (text) and the talker
    (hidden states + tokens); in streaming-speech the thinker's text also feeds the segmenter,
    whose segments talker_stream voices as they arrive."""
    candidates = (
        (Stage.preprocessing, Stage.audio_encoder),
        (Stage.preprocessing, Stage.image_encoder),
        (Stage.audio_encoder, Stage.mm_aggregate),
        (Stage.image_encoder, Stage.mm_aggregate),
        (Stage.mm_aggregate, Stage.thinker),
        (Stage.thinker, Stage.decode),
        (Stage.thinker, Stage.talker),
        (Stage.thinker, Stage.segmenter),
        (Stage.segmenter, Stage.talker_stream),
    )
    present = set(stages)
    return tuple((a, b) for a, b in candidates if a in present and b in present)
