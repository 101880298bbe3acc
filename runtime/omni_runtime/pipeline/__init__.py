"""The stage pipeline: stage graph, continuous batching, stage links, the engine.

``build_engine`` is imported lazily so that importing ``omni_runtime.contract.engine`` (the API
layer does) never pulls in torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omni_runtime.contract.engine import Engine
    from omni_runtime.contract.options import EngineOptions


def build_engine(options: EngineOptions) -> Engine:
    """The engine for ``options`` (not started: ``await engine.start()`` loads and warms it up).

    Raises EngineError for options it cannot honour (unknown pipeline, remote stage names, ...).
    """
    from omni_runtime.pipeline.engine import PipelineEngine

    return PipelineEngine(options)


__all__ = ["build_engine"]
