"""One call per media kind: reference → decoded array, with decoding off the event loop.

Fetching is async I/O; decoding is CPU work in C libraries that release the GIL, so it runs in a
worker thread and a large video never stalls other requests' token streams. Bytes fetched from a
URL that do not decode get the same answer as a fetch that failed (`remote.fetch_failed`): "could
not be decoded" would tell a client that something answered at that address.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import anyio.to_thread
import httpx
import numpy as np

from omni_runtime.media.audio import ENCODER_SAMPLE_RATE, decode_audio
from omni_runtime.media.errors import INVALID_MEDIA, MediaError
from omni_runtime.media.image import decode_image
from omni_runtime.media.limits import MediaLimits
from omni_runtime.media.remote import fetch_failed
from omni_runtime.media.sources import decode_base64, is_remote, load_source
from omni_runtime.media.video import DecodedVideo, VideoOptions, decode_video

log = logging.getLogger(__name__)

T = TypeVar("T")


async def _decode(source: str, decode: Callable[[], T]) -> T:
    try:
        return await anyio.to_thread.run_sync(decode)
    except MediaError as exc:
        if exc.code == INVALID_MEDIA and is_remote(source):
            log.warning("media fetched from %s does not decode: %s", source.strip(), exc.message)
            raise fetch_failed() from None
        raise


async def load_audio(
    source: str,
    *,
    limits: MediaLimits,
    inline_base64: bool = False,
    target_sr: int = ENCODER_SAMPLE_RATE,
    client: httpx.AsyncClient | None = None,
) -> np.ndarray:
    """Mono float32 audio at ``target_sr``; ``inline_base64`` for OpenAI ``input_audio.data``."""
    data = (
        decode_base64(source, limits=limits)
        if inline_base64
        else await load_source(source, limits=limits, client=client)
    )
    return await _decode(
        "" if inline_base64 else source, lambda: decode_audio(data, limits=limits, target_sr=target_sr)
    )


async def load_image(
    source: str, *, limits: MediaLimits, client: httpx.AsyncClient | None = None
) -> np.ndarray:
    data = await load_source(source, limits=limits, client=client)
    return await _decode(source, lambda: decode_image(data, limits=limits))


async def load_video(
    source: str,
    *,
    options: VideoOptions,
    limits: MediaLimits,
    client: httpx.AsyncClient | None = None,
    soundtrack: bool = False,
) -> DecodedVideo:
    """Sampled frames, and with ``soundtrack`` the video's audio track at 16 kHz."""
    data = await load_source(source, limits=limits, client=client)
    return await _decode(
        source, lambda: decode_video(data, options=options, limits=limits, soundtrack=soundtrack)
    )
