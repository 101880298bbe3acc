"""Which variant an engine runs and which of its stages this process hosts (the graph is contract.stages)."""

from __future__ import annotations

from omni_runtime.contract.engine import EngineError
from omni_runtime.contract.options import EngineOptions
from omni_runtime.contract.stages import REMOTABLE, VARIANTS, Stage, with_colocated


def pipeline_variant(options: EngineOptions) -> str:
    variant = "text" if options.text_only else options.pipeline
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
    return frozenset(stages - with_colocated({Stage(name) for name in options.remote_stages}))
