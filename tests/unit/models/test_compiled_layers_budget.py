"""Every decoder layer a process compiles shares one code object, so dynamo's guard cache for it
must grow with every stack compiled (thinker, talker, code predictor), not only the largest: the
Qwen3 speech worker ran its talker layers eagerly once the thinker's budget alone was spent."""

from __future__ import annotations

import torch
import torch._dynamo
from torch import nn

from omni_runtime.executor import slot_cache


def test_the_guard_budget_covers_every_stack_compiled(monkeypatch) -> None:
    config = torch._dynamo.config
    monkeypatch.setattr(slot_cache, "_COMPILED_LAYERS", 0)
    per_layer = slot_cache.GUARD_ENTRIES_PER_LAYER
    # config.patch, not monkeypatch: monkeypatch's undo hides a dynamo config entry (torch 2.15),
    # and every later compile in the process then fails reading it.
    with config.patch(recompile_limit=8, accumulated_recompile_limit=256):
        for layers, total in ((48, 48), (20, 68), (5, 73)):  # Qwen3-Omni: thinker, talker, code predictor
            compiled = slot_cache._compiled(nn.ModuleList(nn.Identity() for _ in range(layers)))
            assert len(compiled) == layers
            assert config.recompile_limit == per_layer * total
            assert config.accumulated_recompile_limit == max(256, per_layer * total * 2)
    assert not config._config["accumulated_recompile_limit"].hide  # later compiles still read it
