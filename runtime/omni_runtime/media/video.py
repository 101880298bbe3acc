"""Video decoding with PyAV: sample frames at a target fps, cap their number and their pixels.

Sampling follows the Qwen-VL recipe (qwen-omni-utils): ``fps`` frames per second of video, at
most ``max_frames`` spread evenly over the whole clip, an even count (the vision tower patches two
frames at a time), and per-frame pixels bounded by ``min_pixels``/``max_pixels`` and by
``total_pixels / frames``. Resizing keeps the aspect ratio; the model's processor still aligns
sizes to its own patch grid, so nothing here is model-specific.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from omni_runtime.media.audio import decode_audio_track
from omni_runtime.media.errors import IMAGE_TOO_LARGE, INVALID_MEDIA, VIDEO_TOO_LONG, MediaError
from omni_runtime.media.limits import MediaLimits

if TYPE_CHECKING:
    import av  # PyAV loads FFmpeg; imported where a container is opened

_MIN_SIDE = 28  # never shrink a side below one vision patch pair


@dataclass(frozen=True)
class VideoOptions:
    """Per-request sampling options (the request's ``video_*`` fields); None means the worker default."""

    fps: float | None = None
    max_frames: int | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None
    total_pixels: int | None = None


@dataclass(frozen=True)
class DecodedVideo:
    frames: np.ndarray  # T x H x W x 3 uint8
    fps: float  # the rate of the sampled frames (T / duration)
    soundtrack: np.ndarray | None = None  # its audio track, mono float32 at 16 kHz, when asked for


def plan_frame_count(*, duration_s: float, fps: float, max_frames: int) -> int:
    """How many frames to sample: duration x fps, at least 1, at most max_frames, even when >= 2."""
    count = max(1, min(max_frames, math.floor(duration_s * fps + 1e-9)))
    if count >= 2:
        count -= count % 2
    return count


def plan_frame_size(*, width: int, height: int, min_pixels: int | None, max_pixels: int) -> tuple[int, int]:
    """The (width, height) a frame is resized to: aspect kept, pixels within [min_pixels, max_pixels].
    The maximum wins: a minimum above it (a request's ``video_min_pixels`` against the worker's
    default maximum) upscales a small frame to the maximum at most, never past it."""
    pixels = width * height
    scale = 1.0
    if pixels > max_pixels:
        scale = math.sqrt(max_pixels / pixels)
    elif min_pixels is not None and pixels < min_pixels:
        scale = math.sqrt(min(min_pixels, max_pixels) / pixels)
    if scale == 1.0:
        return width, height
    new_w = max(_MIN_SIDE, int(width * scale))
    new_h = max(_MIN_SIDE, int(height * scale))
    # Even sizes: YUV 4:2:0 scalers and patch grids both prefer them.
    return new_w - new_w % 2, new_h - new_h % 2


def decode_video(
    data: bytes, *, options: VideoOptions, limits: MediaLimits, soundtrack: bool = False
) -> DecodedVideo:
    """Decode and sample a video, and with ``soundtrack`` its audio track too (the request puts the
    audio in the video); raises MediaError when unreadable, too long, without frames, or without
    the audio track asked for."""
    import av

    if not data:
        raise MediaError("the video is empty (0 bytes)", code=INVALID_MEDIA)
    fps = options.fps if options.fps is not None else limits.default_video_fps
    max_frames = options.max_frames if options.max_frames is not None else limits.max_video_frames
    try:
        container = av.open(io.BytesIO(data), mode="r")
    except (av.error.FFmpegError, ValueError) as exc:
        raise MediaError(
            "the video could not be decoded: not a supported container (send MP4, WebM, MKV or MOV)",
            code=INVALID_MEDIA,
        ) from exc
    with container:
        if not container.streams.video:
            raise MediaError("the media has no video track", code=INVALID_MEDIA)
        if soundtrack and not container.streams.audio:
            raise MediaError(
                "the video has no audio track to put in the video; send it with "
                "mm_processor_kwargs.use_audio_in_video false",
                code=INVALID_MEDIA,
            )
        stream = container.streams.video[0]
        width, height = stream.codec_context.width, stream.codec_context.height
        if width * height > limits.max_image_pixels:
            raise MediaError(
                f"the video frames are {width}x{height}; this worker accepts at most "
                f"{limits.max_image_pixels} pixels per frame",
                code=IMAGE_TOO_LARGE,
            )
        duration = _duration_s(container, stream)
        if duration is None:
            duration = _scan_duration(data)
        if duration > limits.max_video_seconds:
            raise MediaError(
                f"the video is {duration:.1f} s long; this worker accepts at most "
                f"{limits.max_video_seconds:g} s (trim it, or raise --max-video-seconds)",
                code=VIDEO_TOO_LONG,
            )
        count = plan_frame_count(duration_s=duration, fps=fps, max_frames=max_frames)
        # The worker's pixel cap bounds the request's too: a minimum never upscales a frame past it.
        per_frame_max = min(options.max_pixels or limits.default_video_max_pixels, limits.max_image_pixels)
        if options.total_pixels is not None:
            per_frame_max = min(per_frame_max, max(options.total_pixels // count, options.min_pixels or 1))
        out_w, out_h = plan_frame_size(
            width=width, height=height, min_pixels=options.min_pixels, max_pixels=per_frame_max
        )
        # Evenly spread target times over the clip; each takes the first frame at or after it.
        targets = [duration * i / count for i in range(count)]
        frames = _sample(container, stream, targets=targets, width=out_w, height=out_h)
    if not frames:
        raise MediaError("the video decodes to no frames", code=INVALID_MEDIA)
    while len(frames) < count:  # a clip shorter than its metadata: repeat the last frame
        frames.append(frames[-1])
    sampled_fps = count / duration if duration > 0 else fps
    track = decode_audio_track(data, limits=limits) if soundtrack else None
    return DecodedVideo(frames=np.stack(frames), fps=float(sampled_fps), soundtrack=track)


def _duration_s(container: av.container.InputContainer, stream: av.video.stream.VideoStream) -> float | None:
    import av

    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / av.time_base
    if stream.frames and stream.average_rate:
        return stream.frames / float(stream.average_rate)
    return None


def _scan_duration(data: bytes) -> float:
    """Duration from packet timestamps, for containers whose header states none (no decoding)."""
    import av

    last = 0.0
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.video[0]
        for packet in container.demux(stream):
            if packet.pts is not None and packet.time_base is not None:
                end = float((packet.pts + (packet.duration or 0)) * packet.time_base)
                last = max(last, end)
    return last


def _sample(
    container: av.container.InputContainer,
    stream: av.video.stream.VideoStream,
    *,
    targets: list[float],
    width: int,
    height: int,
) -> list[np.ndarray]:
    import av

    frames: list[np.ndarray] = []
    next_target = 0
    start = float(stream.start_time * stream.time_base) if stream.start_time and stream.time_base else 0.0
    try:
        for frame in container.decode(stream):
            t = (frame.time or 0.0) - start
            # Low-fps sources can satisfy several targets with one frame.
            while next_target < len(targets) and t + 1e-6 >= targets[next_target]:
                rgb = frame.reformat(width=width, height=height, format="rgb24", interpolation="BICUBIC")
                frames.append(rgb.to_ndarray())
                next_target += 1
            if next_target >= len(targets):
                break
    except av.error.FFmpegError as exc:
        if not frames:
            raise MediaError(f"the video stream is corrupt: {exc}", code=INVALID_MEDIA) from exc
    return frames
