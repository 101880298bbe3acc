"""`omni tiny-checkpoint` as a user runs it, determinism by seed, and the cached default."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from omni_runtime.models.qwen2_5_omni import tiny

OMNI = Path(sys.executable).parent / "omni"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(OMNI), "tiny-checkpoint", *args], capture_output=True, text=True, timeout=300)


def _same_weights(a: Path, b: Path) -> bool:
    left, right = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return left.keys() == right.keys() and all(left[k].equal(right[k]) for k in left)


def test_cli_writes_the_same_checkpoint_for_the_same_seed(tmp_path: Path, tiny_dir: Path) -> None:
    target = tmp_path / "cli"
    result = _run(str(target), "--seed", "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(target)
    assert "training the BPE tokenizer" in result.stderr  # progress goes to stderr
    assert tiny.is_tiny_checkpoint(target)
    assert _same_weights(target, tiny_dir)
    for name in ("tokenizer.json", "config.json", "processor_config.json"):
        assert (target / name).read_text() == (tiny_dir / name).read_text(), name
    import torch

    left, right = torch.load(target / "spk_dict.pt"), torch.load(tiny_dir / "spk_dict.pt")
    assert left["Chelsie"]["cond"].equal(right["Chelsie"]["cond"])


def test_other_seed_other_weights(tmp_path: Path, tiny_dir: Path) -> None:
    other = tiny.create_tiny_checkpoint(tmp_path / "seed1", seed=1, progress=False)
    assert not _same_weights(other, tiny_dir)
    assert (other / "tokenizer.json").read_text() == (tiny_dir / "tokenizer.json").read_text()


def test_cli_refuses_non_empty_dir_without_force(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    result = _run(str(tmp_path))
    assert result.returncode == 2
    assert "exists and is not empty; pass --force" in result.stderr
    assert "Traceback" not in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize("shape", ["tiny", "released"])
def test_a_dir_that_cannot_be_made_is_one_line_and_exit_2(tmp_path: Path, shape: str) -> None:
    (tmp_path / "file").write_text("x")
    target = tmp_path / "file" / "checkpoint"  # below a file: no directory can be made there
    result = _run(str(target), "--shape", shape, "--quiet")
    assert result.returncode == 2
    assert result.stderr == (
        f"omni tiny-checkpoint: cannot write {target}: Not a directory; choose a DIR you can write\n"
    )
    assert result.stdout == ""


def test_cli_refuses_a_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    result = _run(str(path))
    assert result.returncode == 2
    assert "is not a directory" in result.stderr


def test_cli_force_replaces(tmp_path: Path) -> None:
    (tmp_path / "stale.txt").write_text("old")
    result = _run(str(tmp_path), "--force", "--quiet")
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "stale.txt").exists()
    assert tiny.is_tiny_checkpoint(tmp_path)
    assert result.stderr.count("[tiny-checkpoint") == 0


def test_ensure_creates_once_in_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNI_CACHE_DIR", str(tmp_path))
    first = tiny.ensure_tiny_checkpoint(progress=False)
    assert first == tmp_path / "tiny"
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert tiny.ensure_tiny_checkpoint(progress=False) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"]  # no staging directory left behind
    assert first.stat().st_mode & 0o777 == 0o755
    assert (first / "model.safetensors").stat().st_mode & 0o777 == 0o644


def test_ensure_replaces_a_broken_leftover(tmp_path: Path) -> None:
    broken = tmp_path / "tiny"
    broken.mkdir()
    (broken / "config.json").write_text("{")  # no marker: a crash mid-way, or an old format
    path = tiny.ensure_tiny_checkpoint(tmp_path, progress=False)
    assert path == broken and tiny.is_tiny_checkpoint(path)
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"]


def test_released_qwen2_5_shape_without_weights(tmp_path: Path) -> None:
    """The default family's `--shape released`: the 7B config with the tiny tokenizer's ids and
    its voices, no weights and no tiny marker (it is not a tiny checkpoint)."""
    target = tmp_path / "released-7b"
    result = _run(str(target), "--shape", "released")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(target)
    assert not (target / "model.safetensors").exists() and (target / "spk_dict.pt").is_file()
    from transformers import AutoConfig, Qwen2_5OmniProcessor

    from omni_runtime.models.qwen2_5_omni.tiny import is_tiny_checkpoint

    assert not is_tiny_checkpoint(target)
    config = AutoConfig.from_pretrained(str(target))
    text = config.thinker_config.text_config
    shape = (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads)
    assert shape == (3584, 28, 28, 4) and text.vocab_size == 152064
    tok = Qwen2_5OmniProcessor.from_pretrained(str(target)).tokenizer
    assert config.thinker_config.audio_token_index == tok.convert_tokens_to_ids("<|AUDIO|>")
    assert config.talker_config.tts_text_pad_token_id == tok.convert_tokens_to_ids("<|tts_pad|>")
