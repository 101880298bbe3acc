"""The plain-HF speech baseline runs end to end on random weights with the released codec numbering.

The tiny checkpoint's DiT covers its whole codec vocabulary, so it can never show the bug the
baseline once had on the 7B shapes: a random talker samples codec ids (>= 8194 of 8448) that
token2wav's code embedding lacks, an IndexError on a CPU and a device-side assert on a GPU. This
test gives the tiny config the released numbering (talker vocabulary 8448, codec PAD/BOS/END/MASK
8292/8293/8294/8296, DiT num_embeds 8193) and no spk_dict.pt (the dummy-7B speaker path), runs
`python -m omni_runtime.bench.hf_baseline --speech` through its main(), and checks that codes
outside the table did occur and that the audio came out at 24 kHz with the JSON rows intact.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

RELEASED_CODEC = {
    "vocab_size": 8448,
    "tts_codec_pad_token_id": 8292,
    "tts_codec_start_token_id": 8293,
    "tts_codec_end_token_id": 8294,
    "tts_codec_mask_token_id": 8296,
}
SAMPLES_PER_CODE = 2 * 240  # DiT repeats x BigVGAN upsampling (5*3*2*2*2*2)


@pytest.fixture(scope="module")
def released_codec_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from omni_runtime.models.qwen2_5_omni.tiny import ensure_tiny_checkpoint

    out = tmp_path_factory.mktemp("released-codec")
    config = json.loads((ensure_tiny_checkpoint(progress=False) / "config.json").read_text())
    config["talker_config"].update(RELEASED_CODEC)
    config["token2wav_config"]["dit_config"]["num_embeds"] = 8193
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.slow  # two CPU generate calls (warm-up, timed): the DiT's 36 evaluations dominate
def test_speech_baseline_survives_codes_outside_the_dit_table(
    released_codec_dir: Path, tmp_path: Path
) -> None:
    from omni_runtime.bench.hf_baseline import main
    from omni_runtime.bench.report import load_baselines

    out = tmp_path / "hf.json"
    talker_tokens = 48  # seed 0: out-of-table codes by step 24
    rc = main(
        [
            "--model-path", str(released_codec_dir),
            "--device", "cpu",
            "--concurrency", "1",
            "--no-text",
            "--speech",
            "--prompt-len", "8",
            "--speech-text-tokens", "3",
            "--talker-tokens", str(talker_tokens),
            "--out", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    result = json.loads(out.read_text())
    (extra,) = result["speech"]
    # The failing path was taken: the random talker emitted ids token2wav's table lacks.
    assert extra["codes_replaced"] > 0
    assert extra["sample_rate"] == 24000
    assert extra["samples_per_request"] == [talker_tokens * SAMPLES_PER_CODE]
    assert extra["audio_s"] == pytest.approx(talker_tokens * SAMPLES_PER_CODE / 24000)
    assert extra["audio_s_per_wall_s"] == pytest.approx(extra["audio_s"] / extra["latency_s"])
    assert extra["time_to_first_audio_s"] == extra["latency_s"] > 0
    (row,) = result["levels"]
    assert row["label"] == "hf-generate-speech"
    assert row["concurrency"] == row["requests"] == 1
    assert row["ttfa_p50_s"] == row["latency_p50_s"] == extra["latency_s"]
    assert row["output_tokens_per_s"] == pytest.approx(3 / extra["latency_s"])
    assert result["meta"]["device"] == "cpu"
    # omni bench --baseline-json reads the file as it is.
    (summary,) = load_baselines(out)
    assert summary.ttfa_p50_s == pytest.approx(extra["latency_s"])


def test_bad_model_path_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from omni_runtime.bench.hf_baseline import main

    assert main(["--model-path", str(tmp_path), "--out", str(tmp_path / "x.json")]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_prompt_ids_stay_below_the_specials_and_avoid_marker_ids() -> None:
    import torch
    from transformers import Qwen2_5OmniConfig

    from omni_runtime.bench.hf_baseline import prompt_ids

    markers = {"audio_token_index": 20, "image_token_index": 21, "vision_start_token_id": 30}
    config = Qwen2_5OmniConfig(thinker_config={"text_config": {"vocab_size": 64}, **markers})
    torch.manual_seed(0)
    ids = prompt_ids(batch=4, length=500, config=config, device=torch.device("cpu"))
    assert ids.shape == (4, 500)
    # vocab 64: ids from 48 // 4 = 12 up to the top quarter (48..63, where specials live), markers out
    assert set(ids.unique().tolist()) == set(range(12, 48)) - {20, 21, 30}


def test_qwen3_speech_baseline_runs_its_chat_prompt_through_generate(tmp_path: Path) -> None:
    """Qwen3-Omni-MoE's generate, batched: the user turn and assistant start it looks for, the
    talker's frames (one per talker token) through Code2Wav at 24 kHz, the family in the meta."""
    from omni_runtime.bench.hf_baseline import main
    from omni_runtime.models.qwen3_omni_moe.tiny import ensure_tiny_checkpoint

    frames, samples_per_frame = 10, 1920  # Code2Wav's upsampling: 12.5 frames a second at 24 kHz
    out = tmp_path / "hf.json"
    rc = main(
        [
            "--model-path", str(ensure_tiny_checkpoint(progress=False)),
            "--device", "cpu",
            "--concurrency", "1,2",
            "--speech",
            "--prompt-len", "12",
            "--max-tokens", "4",
            "--speech-text-tokens", "5",
            "--talker-tokens", str(frames),
            "--out", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["meta"]["family"] == "qwen3_omni_moe"
    assert [r["label"] for r in result["levels"]] == ["hf-generate"] * 2 + ["hf-generate-speech"] * 2
    one, two = result["speech"]
    assert (one["concurrency"], two["concurrency"]) == (1, 2)
    (alone,) = one["samples_per_request"]
    assert two["samples_per_request"] == [alone, alone]
    # Code2Wav's causal transposed convolutions drop a few trailing samples of the last frame.
    assert (frames - 1) * samples_per_frame < alone <= frames * samples_per_frame
    assert one["codes_replaced"] == two["codes_replaced"] == 0


def test_qwen3_chat_prompt_places_the_turn_markers() -> None:
    import torch

    from omni_runtime.bench.hf_speech import chat_prompt
    from omni_runtime.models.qwen3_omni_moe.config import released_30b_a3b_config

    config = released_30b_a3b_config()
    ids = chat_prompt(torch.full((2, 9), 7), config)
    start, end, user, assistant = 151644, 151645, 872, 77091
    assert ids.tolist() == [[start, user, 7, 7, end, 7, start, assistant, 7]] * 2
    with pytest.raises(ValueError, match="at least 8 tokens"):
        chat_prompt(torch.full((1, 7), 7), config)


def test_family_must_match_the_model_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from omni_runtime.bench.hf_baseline import main

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_omni"}))
    args = ["--model-path", str(tmp_path), "--out", str(tmp_path / "x.json")]
    assert main([*args, "--family", "qwen3_omni_moe"]) == 2
    assert "--family qwen3_omni_moe but --model-path holds a qwen2_5_omni config" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert main(args) == 2
    assert "model_type 'llama' is not one of qwen2_5_omni, qwen3_omni_moe" in capsys.readouterr().err
