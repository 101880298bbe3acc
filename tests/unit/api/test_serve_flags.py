"""`omni serve` flags: the EngineOptions and limits they make, and exit 2 with a message for bad ones."""

from __future__ import annotations

import pytest

from omni_runtime.contract.options import EngineOptions
from omni_runtime.entrypoints.serve import curl_example, gpu_list, main, parse_args
from omni_runtime.media.limits import MediaLimits


def test_defaults_serve_the_tiny_checkpoint_speech_pipeline() -> None:
    config = parse_args([])
    assert config.options == EngineOptions(pipeline="speech")
    assert config.limits == MediaLimits()
    assert (config.args.host, config.args.port) == ("0.0.0.0", 8000)


def test_the_field_flags_map_to_engine_options() -> None:
    config = parse_args(
        [
            "--model-path", "/models/qwen", "--model-name", "qwen-omni", "--thinker-tp-size", "2",
            "--thinker-gpus", "[0, 1]", "--talker-gpu", "2", "--image-encoder-tp-size", "2",
            "--image-encoder-gpus", "0,1", "--mem-fraction-static", "0.8", "--load-format", "dummy",
            "--device", "cuda", "--pipeline", "streaming-speech", "--max-batch-size", "16",
            "--worker-id", "qwen-w1", "--revision", "abc123", "--remote-stage", "talker=10.0.0.5:9001",
            "--max-model-len", "4096",
        ]
    )  # fmt: skip
    assert config.options == EngineOptions(
        model_path="/models/qwen",
        model_name="qwen-omni",
        pipeline="streaming-speech",
        load_format="dummy",
        device="cuda",
        thinker_tp_size=2,
        thinker_gpus=(0, 1),
        talker_gpu=2,
        image_encoder_tp_size=2,
        image_encoder_gpus=(0, 1),
        mem_fraction_static=0.8,
        max_batch_size=16,
        max_model_len=4096,
        remote_stages={"talker": "10.0.0.5:9001"},
        worker_id="qwen-w1",
        revision="abc123",
    )


def test_text_only_is_the_text_pipeline_and_limits_map() -> None:
    config = parse_args(
        [
            "--text-only", "--max-media-bytes", "1000", "--max-audio-seconds", "5", "--max-video-frames", "3",
            "--max-image-pixels", "100", "--no-remote-media", "--allowed-local-media-path", "/data",
            "--media-fetch-timeout", "2", "--max-video-seconds", "9",
        ]
    )  # fmt: skip
    assert (config.options.pipeline, config.options.text_only) == ("text", True)
    assert config.limits == MediaLimits(
        max_bytes=1000,
        max_audio_seconds=5,
        max_video_seconds=9,
        max_video_frames=3,
        max_image_pixels=100,
        fetch_timeout_s=2,
        allow_remote_urls=False,
        allowed_local_media_path="/data",
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--thinker-gpus", "0,x"], "argument --thinker-gpus: '0,x' is not a GPU list; use 0,1 or [0,1]"),
        (["--thinker-gpus", "0,0"], "argument --thinker-gpus: '0,0' must list distinct GPU ids >= 0"),
        (["--port", "70000"], "argument --port: 70000 is not a TCP port (1-65535)"),
        (["--mem-fraction-static", "1.5"], "argument --mem-fraction-static: 1.5 must be in (0, 1]"),
        (["--pipeline", "video"], "argument --pipeline: invalid choice: 'video'"),
        (
            ["--text-only", "--pipeline", "speech"],
            "--text-only contradicts --pipeline speech; use one of them",
        ),
        (
            ["--thinker-tp-size", "2", "--thinker-gpus", "0"],
            "--thinker-gpus lists 1 GPUs but --thinker-tp-size is 2; give one GPU per rank",
        ),
        (
            ["--thinker-gpus", "0", "--talker-gpu", "0"],
            "--talker-gpu 0 is also a thinker GPU; the talker needs its own GPU",
        ),
        (["--device", "cpu", "--talker-gpu", "1"], "--device cpu contradicts the GPU placement flags"),
        (["--remote-stage", "vocoder=h:1"], "argument --remote-stage: 'vocoder=h:1' must be STAGE=HOST:PORT"),
        (
            ["--remote-stage", "talker=nohost"],
            "argument --remote-stage: 'nohost' in 'talker=nohost' is not HOST:PORT",
        ),
        (["--worker-id", "Worker_1"], "argument --worker-id: 'Worker_1' must be a DNS label"),
        (["--load-format", "dummy"], "--load-format dummy needs --model-path"),
        (
            ["--model-path", "/m", "--tiny-family", "qwen3_omni_moe"],
            "--tiny-family applies only without --model-path (the checkpoint's config.json names its family)",
        ),
        (["--tiny-family", "ming"], "argument --tiny-family: invalid choice: 'ming'"),
        (["--max-tokens-limit", "9000"], "--max-tokens-limit 9000 exceeds --max-model-len 8192"),
        (["--max-batch-size", "0"], "argument --max-batch-size: 0 must be at least 1"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    assert message in capsys.readouterr().err


def test_tiny_family_picks_the_tiny_checkpoint_without_a_model_path() -> None:
    assert parse_args(["--tiny-family", "qwen3_omni_moe"]).options == EngineOptions(
        pipeline="speech", tiny_family="qwen3_omni_moe"
    )
    assert parse_args([]).options.tiny_family == "qwen2_5_omni"


def test_a_family_without_a_tiny_checkpoint_is_an_engine_error() -> None:
    from omni_runtime.contract.engine import EngineError
    from omni_runtime.models.registry import resolve_model_path

    with pytest.raises(EngineError) as caught:
        resolve_model_path(EngineOptions(tiny_family="minicpm_o"))
    assert caught.value.param == "tiny_family"
    assert "no tiny checkpoint for family 'minicpm_o'; choose one of qwen2_5_omni, qwen3_omni_moe" in str(
        caught.value
    )


def test_gpu_list_forms() -> None:
    assert gpu_list("0,1") == (0, 1)
    assert gpu_list("[2, 3]") == (2, 3)
    assert gpu_list(" 4 ") == (4,)


def test_curl_example_uses_a_reachable_host() -> None:
    assert curl_example(host="0.0.0.0", port=8101) == (
        "http://127.0.0.1:8101 — try: curl -s http://127.0.0.1:8101/v1/chat/completions -H 'content-type: "
        'application/json\' -d \'{"messages":[{"role":"user","content":"Hello!"}],"max_tokens":32}\''
    )


def test_port_in_use_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["--host", "127.0.0.1", "--port", str(port)]) == 1
    assert f"omni serve: cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
