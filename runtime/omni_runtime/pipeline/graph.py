"""Stage graphs of the pipeline variants, and which stages a process hosts."""

from __future__ import annotations

from omni_runtime.pipeline.options import EngineOptions
from omni_runtime.pipeline.types import EngineError

TEXT_STAGES = ("preprocessing", "audio_encoder", "image_encoder", "mm_aggregate", "thinker", "decode")
VARIANTS: dict[str, tuple[str, ...]] = {
    "text": TEXT_STAGES,
    "speech": (*TEXT_STAGES, "talker"),
    "streaming-speech": (*TEXT_STAGES, "talker", "segmenter", "talker_stream"),
}
# Edges, for docs and the stage listing: who feeds whom.
EDGES: dict[str, tuple[str, ...]] = {
    "preprocessing": ("audio_encoder", "image_encoder", "mm_aggregate"),
    "audio_encoder": ("mm_aggregate",),
    "image_encoder": ("mm_aggregate",),
    "mm_aggregate": ("thinker",),
    "thinker": ("decode", "talker"),
    "talker": ("segmenter",),
    "segmenter": ("talker_stream",),
}
# Stages that can live in another process behind a stage link. The decode stage and the segmenter
# are cheap per-request logic and stay with the engine; talker_stream (the vocoder) goes with talker.
REMOTABLE = ("preprocessing", "audio_encoder", "image_encoder", "mm_aggregate", "thinker", "talker")


def pipeline_variant(options: EngineOptions) -> str:
    variant = "text" if options.text_only else options.pipeline
    if variant == "duplex":
        raise EngineError(
            "the duplex pipeline needs a model with full-duplex support; Qwen2.5-Omni serves text, speech "
            "and streaming-speech",
            param="pipeline",
        )
    if variant not in VARIANTS:
        raise EngineError(f"unknown pipeline {variant!r}; use one of {', '.join(VARIANTS)}", param="pipeline")
    return variant


def local_stages(options: EngineOptions) -> frozenset[str]:
    """Stages this engine process runs itself (the variant's stages minus the remote ones)."""
    stages = set(VARIANTS[pipeline_variant(options)])
    for name in options.remote_stages:
        if name not in REMOTABLE:
            raise EngineError(
                f"stage {name!r} cannot run remotely; remotable stages: {', '.join(REMOTABLE)}",
                param="remote_stages",
            )
        if name not in stages:
            raise EngineError(f"stage {name!r} is not part of this pipeline", param="remote_stages")
    remote = set(options.remote_stages)
    if "talker" in remote:
        remote.add("talker_stream")
    return frozenset(stages - remote)
