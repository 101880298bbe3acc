"""Media sources: data: URIs, base64, local paths under the allowed directory, and real HTTP fetches."""

from __future__ import annotations

import base64
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from media_synth import encode_png

from omni_runtime.media import MediaError, MediaLimits, load_image
from omni_runtime.media.errors import (
    INVALID_MEDIA,
    MEDIA_FETCH_FAILED,
    MEDIA_SOURCE_FORBIDDEN,
    MEDIA_TOO_LARGE,
)
from omni_runtime.media.sources import decode_base64, decode_data_uri, load_source

LIMITS = MediaLimits()


class _Files(http.server.BaseHTTPRequestHandler):
    """Serves /small (10 bytes), /big (2000 bytes, no Content-Length) and 404 for anything else."""

    def do_GET(self) -> None:
        if self.path == "/small":
            self.send_response(200)
            self.send_header("Content-Length", "10")
            self.end_headers()
            self.wfile.write(b"0123456789")
        elif self.path == "/big":
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"x" * 2000)
        else:
            self.send_error(404)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def http_base() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_data_uri_base64_and_percent_encoded() -> None:
    assert (
        decode_data_uri("data:audio/wav;base64," + base64.b64encode(b"abc").decode(), limits=LIMITS) == b"abc"
    )
    assert decode_data_uri("data:text/plain,a%20b", limits=LIMITS) == b"a b"
    with pytest.raises(MediaError) as caught:
        decode_data_uri("data:image/png;base64", limits=LIMITS)
    assert caught.value.code == INVALID_MEDIA


def test_base64_variants_and_errors() -> None:
    assert (
        decode_base64(base64.urlsafe_b64encode(b"\xfb\xff").decode().rstrip("="), limits=LIMITS)
        == b"\xfb\xff"
    )
    assert decode_base64("YW Jj\n", limits=LIMITS) == b"abc"
    with pytest.raises(MediaError) as caught:
        decode_base64("!!!not base64!!!", limits=LIMITS)
    assert (caught.value.code, str(caught.value)) == (INVALID_MEDIA, "the media data is not valid base64")


def test_base64_over_the_cap_is_413_before_decoding() -> None:
    with pytest.raises(MediaError) as caught:
        decode_base64("A" * 400, limits=MediaLimits(max_bytes=100))
    assert (caught.value.code, caught.value.status) == (MEDIA_TOO_LARGE, 413)
    assert str(caught.value) == (
        "the media is 300 bytes; this worker accepts at most 100 bytes per item "
        "(send a smaller file, or raise --max-media-bytes)"
    )


async def test_local_paths_are_off_by_default(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(b"x")
    with pytest.raises(MediaError) as caught:
        await load_source(str(tmp_path / "a.png"), limits=LIMITS)
    assert caught.value.code == MEDIA_SOURCE_FORBIDDEN
    assert "--allowed-local-media-path" in str(caught.value)


async def test_local_paths_stay_under_the_allowed_directory(tmp_path: Path) -> None:
    allowed = tmp_path / "media"
    allowed.mkdir()
    pixels = np.full((2, 2, 3), 7, dtype=np.uint8)
    (allowed / "a.png").write_bytes(encode_png(pixels))
    (tmp_path / "secret.txt").write_text("no")
    limits = MediaLimits(allowed_local_media_path=str(allowed))
    np.testing.assert_array_equal(await load_image(str(allowed / "a.png"), limits=limits), pixels)
    np.testing.assert_array_equal(await load_image(f"file://{allowed}/a.png", limits=limits), pixels)
    for escape in (str(allowed / ".." / "secret.txt"), str(tmp_path / "secret.txt")):
        with pytest.raises(MediaError) as caught:
            await load_source(escape, limits=limits)
        assert caught.value.code == MEDIA_SOURCE_FORBIDDEN
    with pytest.raises(MediaError) as caught:
        await load_source(str(allowed / "missing.png"), limits=limits)
    assert caught.value.code == INVALID_MEDIA


# The test server is on loopback, which workers refuse unless told otherwise (test_media_remote.py).
LOOPBACK_OK = MediaLimits(allow_private_addresses=True)


async def test_http_fetch_with_caps(http_base: str) -> None:
    assert await load_source(f"{http_base}/small", limits=LOOPBACK_OK) == b"0123456789"
    small_cap = MediaLimits(max_bytes=5, allow_private_addresses=True)
    with pytest.raises(MediaError) as caught:  # refused by Content-Length
        await load_source(f"{http_base}/small", limits=small_cap)
    assert (caught.value.code, caught.value.status) == (MEDIA_TOO_LARGE, 413)
    with pytest.raises(MediaError) as caught:  # refused while streaming (no Content-Length)
        await load_source(
            f"{http_base}/big", limits=MediaLimits(max_bytes=1000, allow_private_addresses=True)
        )
    assert caught.value.code == MEDIA_TOO_LARGE
    with pytest.raises(MediaError) as caught:  # the status stays in the worker's log
        await load_source(f"{http_base}/missing", limits=LOOPBACK_OK)
    assert (caught.value.code, str(caught.value)) == (MEDIA_FETCH_FAILED, "could not fetch media from URL")


async def test_unreachable_url_and_disabled_remote() -> None:
    with pytest.raises(MediaError) as caught:
        await load_source("http://127.0.0.1:9/nothing", limits=LIMITS)
    assert caught.value.code == MEDIA_FETCH_FAILED
    with pytest.raises(MediaError) as caught:
        await load_source("https://example.com/a.png", limits=MediaLimits(allow_remote_urls=False))
    assert caught.value.code == MEDIA_SOURCE_FORBIDDEN


async def test_unknown_scheme_and_empty_reference() -> None:
    for source, fragment in (("ftp://host/a.wav", "unsupported media URL scheme 'ftp'"), ("  ", "empty")):
        with pytest.raises(MediaError) as caught:
            await load_source(source, limits=LIMITS)
        assert fragment in str(caught.value)
