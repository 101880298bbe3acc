"""Each worker's stages and data flow, derived from the runtime's one stage graph.

The graph itself (stage names, variants, edges) is ``omni_runtime.contract.stages``: the runtime
wires its engine from it, so the planner, the renderer's annotations and the runtime's stage wiring
agree. Graph order is the order stages are listed everywhere (pods' --stages, annotations,
--remote-stage flags).
"""

from __future__ import annotations

from omni_operator.api.spec import OmniDeploymentSpec, PipelineVariant
from omni_runtime.contract.stages import VARIANTS, Stage, edges_among


def pipeline_stages(spec: OmniDeploymentSpec, *, talker: bool) -> tuple[Stage, ...]:
    """Stages of the spec's variant: text has no talker; streaming-speech and duplex add segmenter
    and talker_stream (duplex streams its audio too). A disabled audio encoder is left out."""
    if not talker:
        variant = "text"
    elif spec.pipeline in (PipelineVariant.streaming_speech, PipelineVariant.duplex):
        variant = spec.pipeline.value
    else:
        variant = "speech"
    return tuple(
        s for s in VARIANTS[variant] if s is not Stage.audio_encoder or spec.stages.audio_encoder.enabled
    )


def pipeline_edges(stages: tuple[Stage, ...]) -> tuple[tuple[Stage, Stage], ...]:
    """The graph's edges among ``stages`` (contract.stages.EDGES)."""
    return edges_among(stages)
