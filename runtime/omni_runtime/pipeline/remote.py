"""Stages served by another process, reached through a stage link (filled in with the link)."""

from __future__ import annotations

from typing import Any

from omni_runtime.pipeline.options import EngineOptions


async def attach_remote_stages(local: Any, options: EngineOptions) -> Any:
    if not options.remote_stages:
        return local
    raise NotImplementedError("remote stages")
