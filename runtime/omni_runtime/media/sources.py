"""Where media bytes come from: data: URIs, base64 strings, http(s) URLs and (opt-in) local paths.

Every source is size-capped while it is read: base64 by its encoded length, downloads by
Content-Length and again while streaming, files by their size on disk. Local paths are a way to
read the worker's own files, so they are refused unless the operator named a directory they must
stay under (``--allowed-local-media-path``), like vLLM's flag of the same name.
"""

from __future__ import annotations

import base64
import binascii
import os
import urllib.parse
from pathlib import Path

import httpx

from omni_runtime.media.errors import (
    INVALID_MEDIA,
    MEDIA_FETCH_FAILED,
    MEDIA_SOURCE_FORBIDDEN,
    MEDIA_TOO_LARGE,
    MediaError,
)
from omni_runtime.media.limits import MediaLimits


def too_large(size: int, limits: MediaLimits) -> MediaError:
    return MediaError(
        f"the media is {size} bytes; this worker accepts at most {limits.max_bytes} bytes per item "
        "(send a smaller file, or raise --max-media-bytes)",
        code=MEDIA_TOO_LARGE,
        status=413,
    )


def decode_base64(text: str, *, limits: MediaLimits) -> bytes:
    """Base64 (standard or URL-safe, padding optional) to bytes, refusing oversize before decoding."""
    compact = "".join(text.split())
    decoded_size = len(compact) * 3 // 4 - compact[-2:].count("=")  # exact for padded input
    if decoded_size > limits.max_bytes:
        raise too_large(decoded_size, limits)
    padded = compact + "=" * (-len(compact) % 4)
    try:
        if "-" in padded or "_" in padded:
            return base64.urlsafe_b64decode(padded)
        return base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MediaError("the media data is not valid base64", code=INVALID_MEDIA) from exc


def decode_data_uri(uri: str, *, limits: MediaLimits) -> bytes:
    """``data:[<mediatype>][;base64],<data>`` (RFC 2397) to bytes."""
    header, sep, payload = uri[len("data:") :].partition(",")
    if not sep:
        raise MediaError("the data: URI has no ',' before its payload", code=INVALID_MEDIA)
    if header.endswith(";base64"):
        return decode_base64(payload, limits=limits)
    raw = urllib.parse.unquote_to_bytes(payload)
    if len(raw) > limits.max_bytes:
        raise too_large(len(raw), limits)
    return raw


async def fetch_url(url: str, *, limits: MediaLimits, client: httpx.AsyncClient | None = None) -> bytes:
    """Download an http(s) URL with the byte cap and timeout; a failure is the client's MediaError."""
    if not limits.allow_remote_urls:
        raise MediaError(
            "remote media URLs are disabled on this worker; send the media inline as a data: URI",
            code=MEDIA_SOURCE_FORBIDDEN,
        )
    own_client = client is None
    http = client or httpx.AsyncClient(timeout=limits.fetch_timeout_s, follow_redirects=True, max_redirects=3)
    try:
        async with http.stream("GET", url, timeout=limits.fetch_timeout_s) as response:
            if response.status_code >= 400:
                raise MediaError(
                    f"fetching {url} failed: HTTP {response.status_code}", code=MEDIA_FETCH_FAILED
                )
            declared = response.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > limits.max_bytes:
                raise too_large(int(declared), limits)
            body = bytearray()
            async for piece in response.aiter_bytes():
                body += piece
                if len(body) > limits.max_bytes:
                    raise too_large(len(body), limits)
            return bytes(body)
    except httpx.TimeoutException as exc:
        raise MediaError(
            f"fetching {url} timed out after {limits.fetch_timeout_s:g} s", code=MEDIA_FETCH_FAILED
        ) from exc
    except httpx.HTTPError as exc:
        raise MediaError(f"fetching {url} failed: {exc}", code=MEDIA_FETCH_FAILED) from exc
    finally:
        if own_client:
            await http.aclose()


def read_local(path_text: str, *, limits: MediaLimits) -> bytes:
    """Read a local file that lies below the allowed media directory."""
    if limits.allowed_local_media_path is None:
        raise MediaError(
            "local file paths are disabled on this worker; send a URL or a data: URI, or start the worker "
            "with --allowed-local-media-path DIR",
            code=MEDIA_SOURCE_FORBIDDEN,
        )
    root = Path(limits.allowed_local_media_path).resolve()
    path = Path(path_text).expanduser().resolve()  # resolves symlinks and '..' before the check
    if not path.is_relative_to(root):
        raise MediaError(
            f"{path_text} is outside the allowed media directory {root}", code=MEDIA_SOURCE_FORBIDDEN
        )
    if not path.is_file():
        raise MediaError(f"{path_text} does not exist or is not a file", code=INVALID_MEDIA)
    size = os.path.getsize(path)
    if size > limits.max_bytes:
        raise too_large(size, limits)
    return path.read_bytes()


async def load_source(source: str, *, limits: MediaLimits, client: httpx.AsyncClient | None = None) -> bytes:
    """Bytes of a media reference: data: URI, http(s) URL, file:// URL or local path."""
    text = source.strip()
    if not text:
        raise MediaError("the media reference is empty", code=INVALID_MEDIA)
    scheme = text.split(":", 1)[0].lower() if ":" in text else ""
    if scheme == "data":
        return decode_data_uri(text, limits=limits)
    if scheme in {"http", "https"}:
        return await fetch_url(text, limits=limits, client=client)
    if scheme == "file":
        return read_local(urllib.parse.unquote(urllib.parse.urlparse(text).path), limits=limits)
    if scheme and len(scheme) > 1:  # "c:" style drive letters are paths, anything else is not ours
        raise MediaError(
            f"unsupported media URL scheme {scheme!r}; use http(s), data: or a local path",
            code=INVALID_MEDIA,
        )
    return read_local(text, limits=limits)
