"""Load every media item a chat request names, concurrently, into the engine's `MediaInput`s.

All items are fetched and decoded at once; if several are bad, the first in request order is
reported, so a client sees the same error every time it sends the same request.
"""

from __future__ import annotations

import asyncio

from omni_runtime.api.chat.protocol import ChatCompletionRequest, MediaRef
from omni_runtime.contract.engine import MediaInput
from omni_runtime.media import (
    ENCODER_SAMPLE_RATE,
    MediaError,
    MediaLimits,
    load_audio,
    load_image,
    load_video,
)
from omni_runtime.media.video import VideoOptions


async def _load_one(
    ref: MediaRef, *, limits: MediaLimits, video: VideoOptions, soundtrack: bool
) -> MediaInput:
    try:
        if ref.kind == "audio":
            pcm = await load_audio(ref.source, limits=limits, inline_base64=ref.inline_base64)
            return MediaInput(kind="audio", data=pcm, sample_rate=ENCODER_SAMPLE_RATE)
        if ref.kind == "image":
            return MediaInput(kind="image", data=await load_image(ref.source, limits=limits))
        decoded = await load_video(ref.source, options=video, limits=limits, soundtrack=soundtrack)
        return MediaInput(kind="video", data=decoded.frames, fps=decoded.fps, soundtrack=decoded.soundtrack)
    except MediaError as exc:
        raise exc.with_param(ref.param) from exc


async def load_request_media(request: ChatCompletionRequest, *, limits: MediaLimits) -> dict[str, MediaInput]:
    """Decoded media keyed by the field path that named it (MediaRef.param)."""
    refs = request.media_refs()
    if not refs:
        return {}
    video = request.video_options()
    soundtrack = request.use_audio_in_video
    results = await asyncio.gather(
        *(_load_one(r, limits=limits, video=video, soundtrack=soundtrack) for r in refs),
        return_exceptions=True,
    )
    loaded: dict[str, MediaInput] = {}
    for ref, result in zip(refs, results, strict=True):
        if isinstance(result, BaseException):
            raise result
        loaded[ref.param] = result
    return loaded
