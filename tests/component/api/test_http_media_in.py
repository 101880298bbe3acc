"""Image, audio and video in, through every way a request can carry media."""

from __future__ import annotations

import base64

import pytest
from api_media import data_uri, espeak_wav, mp4_bytes, png_bytes, tone_wav

from conftest import Worker


def _ask(worker: Worker, body: dict[str, object]) -> dict[str, object]:
    with worker.client() as client:
        response = client.post("/v1/chat/completions", json={"max_tokens": 4, **body})
    assert response.status_code == 200, response.text
    return response.json()


def _tokens(body: dict[str, object]) -> tuple[int, int]:
    usage = body["usage"]
    assert isinstance(usage, dict)
    return int(usage["prompt_tokens"]), int(usage["completion_tokens"])


def test_image_part_as_data_uri_adds_prompt_tokens(worker: Worker) -> None:
    plain = _ask(worker, {"messages": [{"role": "user", "content": "Describe."}]})
    content = [
        {"type": "image_url", "image_url": {"url": data_uri("image/png", png_bytes())}},
        {"type": "text", "text": "Describe."},
    ]
    with_image = _ask(worker, {"messages": [{"role": "user", "content": content}]})
    assert _tokens(with_image)[0] > _tokens(plain)[0]  # the vision tokens reached the thinker
    assert _tokens(with_image)[1] >= 1


def test_input_audio_base64_tone(worker: Worker) -> None:
    audio = {"data": base64.b64encode(tone_wav(seconds=1.0)).decode(), "format": "wav"}
    content = [{"type": "input_audio", "input_audio": audio}, {"type": "text", "text": "What is this?"}]
    plain = _ask(worker, {"messages": [{"role": "user", "content": "What is this?"}]})
    body = _ask(worker, {"messages": [{"role": "user", "content": content}]})
    assert _tokens(body)[0] > _tokens(plain)[0]


def test_espeak_speech_as_audio_url(worker: Worker) -> None:
    speech = espeak_wav("Hello, this is a test of the omni worker.")
    if speech is None:
        pytest.skip("espeak-ng is not installed (apt-get install -y espeak-ng)")
    content = [{"type": "audio_url", "audio_url": {"url": data_uri("audio/wav", speech)}}]
    assert _tokens(_ask(worker, {"messages": [{"role": "user", "content": content}]}))[1] >= 1


def test_video_part_with_sampling_options(worker: Worker) -> None:
    content = [
        {"type": "video_url", "video_url": {"url": data_uri("video/mp4", mp4_bytes(frames=8, fps=4))}},
        {"type": "text", "text": "What happens?"},
    ]
    two = _ask(worker, {"messages": [{"role": "user", "content": content}], "video_fps": 1.0})
    four = _ask(worker, {"messages": [{"role": "user", "content": content}], "video_fps": 2.0})
    assert _tokens(four)[0] > _tokens(two)[0]  # more sampled frames, more video tokens


def test_top_level_lists_from_local_paths_join_the_first_user_message(worker: Worker) -> None:
    (worker.media_dir / "cat.png").write_bytes(png_bytes())
    (worker.media_dir / "tone.wav").write_bytes(tone_wav(seconds=0.5, sample_rate=16000))
    (worker.media_dir / "clip.mp4").write_bytes(mp4_bytes(frames=4, fps=4))
    body = _ask(
        worker,
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "All three?"},
            ],
            "images": [str(worker.media_dir / "cat.png")],
            "audios": [f"file://{worker.media_dir / 'tone.wav'}"],
            "videos": [str(worker.media_dir / "clip.mp4")],
            "video_max_frames": 2,
        },
    )
    plain = _ask(worker, {"messages": [{"role": "user", "content": "All three?"}]})
    assert _tokens(body)[0] > _tokens(plain)[0]


def test_edge_media_is_read_or_refused_by_name_for_both_families(speech_worker: Worker) -> None:
    """A 5 ms clip is read (Qwen3's processor pads audio only to the request's longest), and an
    image whose long side is over 200 times its short one is a 400 naming the part, not a 500."""
    clip = {"data": base64.b64encode(tone_wav(seconds=0.005, sample_rate=16_000)).decode(), "format": "wav"}
    content = [{"type": "input_audio", "input_audio": clip}, {"type": "text", "text": "What is this?"}]
    assert _tokens(_ask(speech_worker, {"messages": [{"role": "user", "content": content}]}))[1] >= 1

    strip = {
        "type": "image_url",
        "image_url": {"url": data_uri("image/png", png_bytes(width=3000, height=14))},
    }
    with speech_worker.client() as client:
        response = client.post(
            "/v1/chat/completions", json={"max_tokens": 2, "messages": [{"role": "user", "content": [strip]}]}
        )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("messages[0].content[0].image_url.url", "invalid_media")
    assert "3000x14, a side over 200 times the other" in error["message"]
