"""`omni tiny-checkpoint --family qwen3_omni_moe` as a user runs it: the released Qwen3-Omni-MoE
layout that transformers' own classes load, the same weights for the same seed, and the cached
default made once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from safetensors import safe_open

from omni_runtime.models.qwen3_omni_moe import tiny

OMNI = Path(sys.executable).parent / "omni"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(OMNI), "tiny-checkpoint", *args], capture_output=True, text=True, timeout=300)


def test_cli_writes_the_released_layout_that_transformers_loads(tmp_path: Path) -> None:
    target = tmp_path / "qwen3"
    result = _run(str(target), "--family", "qwen3_omni_moe", "--quiet")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(target)
    assert tiny.is_tiny_checkpoint(target)
    config = json.loads((target / "config.json").read_text())
    assert config["model_type"] == "qwen3_omni_moe"
    assert config["talker_config"]["text_config"]["shared_expert_intermediate_size"] == 64
    with safe_open(str(target / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    # The released layout: per-expert weights under thinker.model, the towers, talker and code2wav.
    assert "thinker.model.layers.0.mlp.experts.7.gate_proj.weight" in keys
    assert "thinker.lm_head.weight" in keys
    assert {k.split(".")[0] for k in keys} == {"thinker", "talker", "code2wav"}
    assert any(k.startswith("thinker.audio_tower.") for k in keys)
    assert any(k.startswith("thinker.visual.") for k in keys)
    assert any(k.startswith("talker.code_predictor.") for k in keys)

    from transformers import Qwen3OmniMoeForConditionalGeneration, Qwen3OmniMoeProcessor

    processor = Qwen3OmniMoeProcessor.from_pretrained(str(target))
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "hi"}]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    import numpy as np

    out = processor(text=[text], audio=[np.zeros(16000, dtype=np.float32)], return_tensors="pt")
    audio_id = config["thinker_config"]["audio_token_id"]
    assert int((out["input_ids"] == audio_id).sum()) == 13  # one second: 13 audio tokens, as released
    model, info = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(target), output_loading_info=True)
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    assert model.config.thinker_config.text_config.num_experts == 8


def test_same_seed_same_weights_and_the_cache_is_made_once(tmp_path: Path) -> None:
    first = tiny.ensure_tiny_checkpoint(tmp_path, progress=False)
    assert first == tmp_path / tiny.CACHE_NAME
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert tiny.ensure_tiny_checkpoint(tmp_path, progress=False) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [tiny.CACHE_NAME]  # no staging directory left behind
    again = tiny.create_tiny_checkpoint(tmp_path / "again", seed=0, progress=False)
    with (
        safe_open(str(first / "model.safetensors"), "pt") as a,
        safe_open(str(again / "model.safetensors"), "pt") as b,
    ):
        assert set(a.keys()) == set(b.keys())
        assert all(a.get_tensor(k).equal(b.get_tensor(k)) for k in a.keys())  # noqa: SIM118
    # A Qwen2.5 tiny marker is not a Qwen3 one.
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "omni_tiny.json").write_text('{"format_version": 1}')
    assert not tiny.is_tiny_checkpoint(tmp_path / "other")


def test_released_shape_without_weights_for_dummy_loading(tmp_path: Path) -> None:
    """`--shape released` writes the 30B-A3B config with the tokenizer beside it (ids remapped),
    no weights: what `omni serve --load-format dummy` builds at the released size on a GPU."""
    target = tmp_path / "released"
    result = _run(str(target), "--family", "qwen3_omni_moe", "--shape", "released")
    assert result.returncode == 0, result.stderr
    assert not (target / "model.safetensors").exists()
    import torch
    from transformers import AutoConfig, Qwen3OmniMoeProcessor
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf

    from omni_runtime.models.qwen3_omni_moe.config import ensure_talker_fields

    config = ensure_talker_fields(AutoConfig.from_pretrained(str(target)))
    text = config.thinker_config.text_config
    assert (text.num_hidden_layers, text.num_experts, text.num_experts_per_tok, text.vocab_size) == (
        48,
        128,
        8,
        152064,
    )
    processor = Qwen3OmniMoeProcessor.from_pretrained(str(target))
    tok = processor.tokenizer
    assert config.thinker_config.audio_token_id == tok.convert_tokens_to_ids("<|audio_pad|>")
    assert config.thinker_config.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
    assert config.assistant_token_id == tok.convert_tokens_to_ids("assistant")
    with torch.device("meta"):
        model = hf.Qwen3OmniMoeThinkerTextModel._from_config(text)
    assert round(sum(p.numel() for p in model.parameters()) / 1e9, 1) == 30.2  # + the 0.3B LM head: 30.5B
