"""Dummy weights (`--load-format dummy`) are the same tensors on every build of a module class:
two server starts serve the same model (an A/B bench's sides do the same work), and a process
that hosts only the talker draws the talker that a whole-pipeline process draws."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as hf
from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniConfig

from omni_runtime.models.qwen2_5_omni.loader import build_module
from omni_runtime.models.qwen2_5_omni.tiny import tiny_config_dict

CPU = torch.device("cpu")


def tiny_config() -> Qwen2_5OmniConfig:
    return Qwen2_5OmniConfig(**tiny_config_dict(user_token_id=151644))


def build(cls: type, config: object) -> dict[str, torch.Tensor]:
    return build_module(cls, config, device=CPU, dtype=torch.float32, random=True).state_dict()


def test_a_dummy_module_is_the_same_on_every_build_whatever_was_built_before() -> None:
    config = tiny_config()
    text_config = config.thinker_config.text_config
    first = build(hf.Qwen2_5OmniThinkerTextModel, text_config)
    torch.rand(1000)  # the global generator moved on, as other modules' construction moves it
    build(hf.Qwen2_5OmniTalkerForConditionalGeneration, config.talker_config)
    again = build(hf.Qwen2_5OmniThinkerTextModel, text_config)
    assert first.keys() == again.keys()
    assert all(torch.equal(first[name], again[name]) for name in first)
    # random, not a constant: the embedding rows differ
    embed = first["embed_tokens.weight"]
    assert embed.std() > 0 and not torch.equal(embed[0], embed[1])


def test_two_classes_draw_from_their_own_seeds() -> None:
    config = tiny_config()
    thinker = build(hf.Qwen2_5OmniThinkerTextModel, config.thinker_config.text_config)
    talker = build(hf.Qwen2_5OmniTalkerForConditionalGeneration, config.talker_config)
    same_shape = [
        (a, b)
        for a in thinker.values()
        for b in talker.values()
        if a.shape == b.shape and a.dim() == 2 and a.std() > 0
    ]
    assert same_shape and not any(torch.equal(a, b) for a, b in same_shape)


def test_the_dummy_embedding_is_one_table_wherever_it_is_built() -> None:
    """The thinker's table, a lone multimodal aggregation's copy and the rows a talker-only process
    draws are the same numbers (each value a function of its row and column alone)."""
    from torch import nn

    from omni_runtime.models.qwen2_5_omni.loader import dummy_embedding_rows, fill_dummy_embedding

    table = nn.Embedding(3000, 64).weight
    fill_dummy_embedding(table)  # 3000 rows: the fill runs in chunks
    rows = torch.tensor([0, 1, 2047, 2999])
    assert torch.equal(table[rows], dummy_embedding_rows(rows, 64))
    assert table.std().item() == pytest.approx(0.02, rel=0.05) and abs(table.mean().item()) < 1e-3
    assert not torch.equal(table[0], table[1]) and not torch.equal(table[:, 0], table[:, 1])
    again = nn.Embedding(3000, 64).weight
    fill_dummy_embedding(again)
    assert torch.equal(table, again)
