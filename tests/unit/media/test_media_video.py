"""Video sampling: fps, frame caps, pixel budgets, and the errors for unusable video."""

from __future__ import annotations

import numpy as np
import pytest
from media_synth import encode_mp4, peak_frequency

from omni_runtime.media import MediaError, MediaLimits, VideoOptions, decode_video
from omni_runtime.media.errors import IMAGE_TOO_LARGE, INVALID_MEDIA, VIDEO_TOO_LONG
from omni_runtime.media.video import plan_frame_count, plan_frame_size

LIMITS = MediaLimits()


@pytest.fixture(scope="module")
def three_seconds() -> bytes:
    # 30 frames at 10 fps, 64x48; frame i is grey level (i * 20) % 256.
    return encode_mp4(frames=30, fps=10, width=64, height=48)


def test_samples_at_requested_fps(three_seconds: bytes) -> None:
    video = decode_video(three_seconds, options=VideoOptions(fps=2.0), limits=LIMITS)
    assert video.frames.shape == (6, 48, 64, 3)
    assert video.frames.dtype == np.uint8
    assert video.fps == pytest.approx(2.0)
    # Frames 0, 5, 10, 15, 20, 25 of the source.
    levels = video.frames[:, 10, 10, 0].astype(int)
    assert np.abs(levels - [0, 100, 200, 44, 144, 244]).max() <= 2  # YUV rounding


def test_max_frames_spreads_over_the_whole_clip(three_seconds: bytes) -> None:
    video = decode_video(three_seconds, options=VideoOptions(fps=10.0, max_frames=4), limits=LIMITS)
    assert video.frames.shape[0] == 4
    assert video.fps == pytest.approx(4 / 3)
    # Targets 0, 0.75, 1.5, 2.25 s -> source frames 0, 8 (first at/after 0.75 s), 15, 23.
    levels = video.frames[:, 10, 10, 0].astype(int)
    assert np.abs(levels - [0, 160, 44, 204]).max() <= 2


def test_pixel_budgets_downscale_keeping_aspect(three_seconds: bytes) -> None:
    video = decode_video(three_seconds, options=VideoOptions(fps=2.0, max_pixels=768), limits=LIMITS)
    # sqrt(768 / 3072) = 0.5 -> 32x24, but no side goes below 28 pixels.
    assert video.frames.shape[1:] == (28, 32, 3)
    # total_pixels shares a budget over the 6 frames: 6 * 1200 -> 1200 per frame -> 40x30.
    total = decode_video(three_seconds, options=VideoOptions(fps=2.0, total_pixels=6 * 1200), limits=LIMITS)
    assert total.frames.shape == (6, 30, 40, 3)


def test_min_pixels_upscales() -> None:
    data = encode_mp4(frames=4, fps=4, width=32, height=32)
    video = decode_video(data, options=VideoOptions(min_pixels=64 * 64), limits=LIMITS)
    assert video.frames.shape[1:3] == (64, 64)


@pytest.mark.parametrize(
    ("options", "cap", "size"),
    [
        (VideoOptions(min_pixels=10**9), 40_000_000, (774, 774)),  # alone: the default maximum, 602112
        (VideoOptions(min_pixels=10**9, max_pixels=10**9), 100 * 100, (100, 100)),  # both: the worker's cap
        (VideoOptions(min_pixels=64 * 64, max_pixels=10**9), 100 * 100, (64, 64)),
    ],
)
def test_a_huge_minimum_stops_at_the_maximum_and_the_workers_cap(
    options: VideoOptions, cap: int, size: tuple
) -> None:
    data = encode_mp4(frames=2, fps=2, width=32, height=32)
    video = decode_video(data, options=options, limits=MediaLimits(max_image_pixels=cap))
    assert video.frames.shape[1:3] == size


def test_plan_frame_count_exact() -> None:
    assert plan_frame_count(duration_s=3.0, fps=2.0, max_frames=64) == 6
    assert plan_frame_count(duration_s=3.0, fps=2.0, max_frames=5) == 4  # even
    assert plan_frame_count(duration_s=0.2, fps=2.0, max_frames=64) == 1
    assert plan_frame_count(duration_s=100.0, fps=2.0, max_frames=64) == 64


def test_plan_frame_size_exact() -> None:
    assert plan_frame_size(width=640, height=480, min_pixels=None, max_pixels=640 * 480) == (640, 480)
    assert plan_frame_size(width=640, height=480, min_pixels=None, max_pixels=320 * 240) == (320, 240)
    assert plan_frame_size(width=10, height=10, min_pixels=56 * 56, max_pixels=10**6) == (56, 56)
    # A minimum above the maximum (video_min_pixels alone, past the worker's default): the maximum wins.
    assert plan_frame_size(width=64, height=48, min_pixels=10**9, max_pixels=640 * 480) == (640, 480)
    assert plan_frame_size(width=640, height=480, min_pixels=10**9, max_pixels=320 * 240) == (320, 240)


def test_too_long_video(three_seconds: bytes) -> None:
    with pytest.raises(MediaError) as caught:
        decode_video(three_seconds, options=VideoOptions(), limits=MediaLimits(max_video_seconds=2))
    assert caught.value.code == VIDEO_TOO_LONG
    assert str(caught.value).startswith("the video is 3.0 s long; this worker accepts at most 2 s")


def test_frames_over_pixel_cap(three_seconds: bytes) -> None:
    with pytest.raises(MediaError) as caught:
        decode_video(three_seconds, options=VideoOptions(), limits=MediaLimits(max_image_pixels=1000))
    assert caught.value.code == IMAGE_TOO_LARGE


@pytest.mark.parametrize("data", [b"", b"not a video" * 50])
def test_unreadable_video(data: bytes) -> None:
    with pytest.raises(MediaError) as caught:
        decode_video(data, options=VideoOptions(), limits=LIMITS)
    assert caught.value.code == INVALID_MEDIA


def test_soundtrack_comes_with_the_frames_when_asked_for() -> None:
    """use_audio_in_video: the video's own audio track, mono at the audio encoder's 16 kHz."""
    data = encode_mp4(frames=8, fps=4, width=64, height=48, with_audio=True)  # 2 s, a 440 Hz tone
    plain = decode_video(data, options=VideoOptions(fps=2.0), limits=LIMITS)
    assert plain.soundtrack is None
    video = decode_video(data, options=VideoOptions(fps=2.0), limits=LIMITS, soundtrack=True)
    assert video.frames.shape == plain.frames.shape
    assert video.soundtrack is not None and video.soundtrack.dtype == np.float32
    assert 2.0 <= video.soundtrack.size / 16_000 < 2.0 + 2 * 1024 / 16_000  # AAC pads to whole frames
    assert peak_frequency(video.soundtrack, 16_000) == pytest.approx(440, abs=5)


def test_a_silent_video_asked_for_its_soundtrack_names_the_fix(three_seconds: bytes) -> None:
    with pytest.raises(MediaError) as err:
        decode_video(three_seconds, options=VideoOptions(fps=2.0), limits=LIMITS, soundtrack=True)
    assert err.value.code == INVALID_MEDIA
    assert "no audio track" in err.value.message and "use_audio_in_video false" in err.value.message
