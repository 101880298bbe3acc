"""Configurable limits on client media, so one request cannot exhaust a worker.

Every limit is enforced before the expensive step it protects: byte caps before download or
base64 decoding finishes, pixel caps before an image is decoded, duration caps from container
metadata before frames are decoded.
"""

from __future__ import annotations

from dataclasses import dataclass

# Qwen2.5-Omni's video defaults (qwen-omni-utils): 2 fps sampling, at most 768 x 28 x 28 pixels per frame.
DEFAULT_VIDEO_FPS = 2.0
DEFAULT_VIDEO_MAX_PIXELS = 768 * 28 * 28


@dataclass(frozen=True)
class MediaLimits:
    max_bytes: int = 64 * 1024 * 1024  # per media item, after base64 decoding / download
    max_audio_seconds: float = 600.0
    max_video_seconds: float = 600.0
    max_video_frames: int = 64  # sampled frames per video (a request may ask for fewer)
    max_image_pixels: int = 40_000_000  # width x height of a decoded image or video frame
    default_video_fps: float = DEFAULT_VIDEO_FPS
    default_video_max_pixels: int = DEFAULT_VIDEO_MAX_PIXELS
    fetch_timeout_s: float = 20.0
    allow_remote_urls: bool = True
    # Local paths (and file:// URLs) are read only below this directory; None disables them,
    # because a path is a way to read the worker's own files.
    allowed_local_media_path: str | None = None
