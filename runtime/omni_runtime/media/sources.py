"""Where media bytes come from: data: URIs, base64 strings, http(s) URLs and (opt-in) local paths.

Every source is size-capped while it is read: base64 by its encoded length, downloads by
Content-Length and again while streaming, files by their size on disk. URLs are fetched by
`omni_runtime.media.remote`, which checks every hop's addresses before it connects. Local paths
are a way to read the worker's own files, so they are refused unless the operator named a
directory they must stay under (``--allowed-local-media-path``), like vLLM's flag of the same name.
"""

from __future__ import annotations

import base64
import binascii
import os
import urllib.parse
from pathlib import Path

import httpx

from omni_runtime.media.errors import INVALID_MEDIA, MEDIA_SOURCE_FORBIDDEN, MediaError
from omni_runtime.media.limits import MediaLimits, too_large
from omni_runtime.media.remote import Resolver, fetch_url, system_resolver


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


def read_local(path_text: str, *, limits: MediaLimits) -> bytes:
    """Read a local file that lies below the allowed media directory."""
    if limits.allowed_local_media_path is None:
        raise MediaError(
            "local file paths are disabled on this worker; send a URL or a data: URI, or start the worker "
            "with --allowed-local-media-path DIR",
            code=MEDIA_SOURCE_FORBIDDEN,
        )
    if "\x00" in path_text:
        raise MediaError(
            "the local path contains a NUL character, which no file name holds; send the file's path",
            code=INVALID_MEDIA,
        )
    root = Path(limits.allowed_local_media_path).resolve()
    try:
        path = Path(path_text).expanduser().resolve()  # resolves symlinks and '..' before the check
    except RuntimeError as exc:  # "~name/...": no user of that name on this worker
        raise MediaError(
            f"{path_text} names the home directory of a user this worker does not have; send the file's "
            "full path",
            code=INVALID_MEDIA,
        ) from exc
    if not path.is_relative_to(root):
        raise MediaError(
            f"{path_text} is outside the allowed media directory {root}", code=MEDIA_SOURCE_FORBIDDEN
        )
    try:
        if not path.is_file():
            raise MediaError(f"{path_text} does not exist or is not a file", code=INVALID_MEDIA)
        size = os.path.getsize(path)
        if size > limits.max_bytes:
            raise too_large(size, limits)
        return path.read_bytes()
    except OSError as exc:  # a name too long for the file system, a file the worker may not read
        raise MediaError(
            f"{path_text} could not be read ({exc.strerror or 'unreadable'}); send the file as a data: URI",
            code=INVALID_MEDIA,
        ) from exc


def scheme_of(source: str) -> str:
    """The URL scheme of a media reference, lower case; "" for a plain path."""
    text = source.strip()
    return text.split(":", 1)[0].lower() if ":" in text else ""


def is_remote(source: str) -> bool:
    return scheme_of(source) in {"http", "https"}


async def load_source(
    source: str,
    *,
    limits: MediaLimits,
    client: httpx.AsyncClient | None = None,
    resolver: Resolver = system_resolver,
) -> bytes:
    """Bytes of a media reference: data: URI, http(s) URL, file:// URL or local path."""
    text = source.strip()
    if not text:
        raise MediaError("the media reference is empty", code=INVALID_MEDIA)
    scheme = scheme_of(text)
    if scheme == "data":
        return decode_data_uri(text, limits=limits)
    if scheme in {"http", "https"}:
        return await fetch_url(text, limits=limits, client=client, resolver=resolver)
    if scheme == "file":
        try:
            path = urllib.parse.urlparse(text).path
        except ValueError as exc:  # e.g. an unclosed '[' in the host part
            raise MediaError(
                f"the file: URL is not valid ({exc}); send file:///absolute/path or a plain path",
                code=INVALID_MEDIA,
            ) from exc
        return read_local(urllib.parse.unquote(path), limits=limits)
    if scheme and len(scheme) > 1:  # "c:" style drive letters are paths, anything else is not ours
        raise MediaError(
            f"unsupported media URL scheme {scheme!r}; use http(s), data: or a local path",
            code=INVALID_MEDIA,
        )
    return read_local(text, limits=limits)
