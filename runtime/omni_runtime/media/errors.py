"""Media errors a client can cause, carrying what the API needs to answer them.

The media layer knows nothing about HTTP; it raises `MediaError` with the request field that held
the media (``param``), a stable ``code`` and the status the API should use (400 for unreadable or
too-long media, 413 for payloads over the byte cap). The API maps it to OpenAI error JSON.
"""

from __future__ import annotations

# Stable codes: clients and tests match on these, so they never change meaning.
INVALID_MEDIA = "invalid_media"  # cannot be decoded / unsupported container or codec
MEDIA_TOO_LARGE = "media_too_large"  # bytes over the configured cap (HTTP 413)
AUDIO_TOO_LONG = "audio_too_long"
VIDEO_TOO_LONG = "video_too_long"
IMAGE_TOO_LARGE = "image_too_large"  # pixel count over the cap
MEDIA_FETCH_FAILED = "media_fetch_failed"  # URL unreachable, timed out, non-2xx
MEDIA_SOURCE_FORBIDDEN = "media_source_forbidden"  # local path outside the allowed dir, scheme off


class MediaError(Exception):
    """A media item the worker cannot use; ``param`` is the request field path that named it."""

    def __init__(self, message: str, *, code: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.status = status

    def with_param(self, param: str) -> MediaError:
        """The same error attributed to a request field (decoders do not know where bytes came from)."""
        return MediaError(self.message, code=self.code, param=param, status=self.status)
