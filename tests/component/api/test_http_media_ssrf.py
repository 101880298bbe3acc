"""Media URLs cannot make a real worker reach its own network, and every refusal reads the same.

Two text workers on the tiny checkpoint: one with the defaults (private addresses refused), one
as a user who serves media inside their network would start it
(``--allow-private-media-addresses --allowed-media-domain 127.0.0.1 ...``) with 127.0.0.2 refused
(``--deny-media-network 127.0.0.2/32``) to stand for an address it must not reach. A small HTTP
server on 127.0.0.1 (and one on 127.0.0.2) serves the media and counts what reaches it, so a test
can tell a refusal before connecting from a failed request. Nothing here reaches the internet:
the "allowed" first hop of the redirect test is loopback made allowed by the opt-out.
"""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_media import png_bytes

from conftest import Worker, make_engine, start_worker, tiny_settings
from omni_runtime.media.limits import MediaLimits

GENERIC = "could not fetch media from URL"


class MediaServer:
    def __init__(self, host: str) -> None:
        self.hits: list[str] = []
        hits, png = self.hits, png_bytes()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                if self.path == "/cat.png":
                    self._send(200, png, "image/png")
                elif self.path == "/garbage.png":
                    self._send(200, b"this is not an image", "image/png")
                elif self.path == "/forbidden":
                    self._send(403, b"forbidden", "text/plain")
                elif self.path.startswith("/to?url="):
                    self.send_response(302)
                    self.send_header("Location", self.path[len("/to?url=") :])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self._send(404, b"missing", "text/plain")

            def _send(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.base = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def media() -> Iterator[MediaServer]:
    server = MediaServer("127.0.0.1")
    yield server
    server.close()


@pytest.fixture(scope="module")
def other_media() -> Iterator[MediaServer]:
    server = MediaServer("127.0.0.2")  # loopback too on Linux; the open worker refuses it
    yield server
    server.close()


@pytest.fixture(scope="module")
def guarded(media_dir: Path, tiny_checkpoint: Path) -> Iterator[Worker]:
    """The defaults: any public host, no private address."""
    yield from start_worker(
        engine=make_engine(tiny_checkpoint, pipeline="text"),
        settings=tiny_settings(tiny_checkpoint, media=MediaLimits(), max_tokens_limit=16),
        media_dir=media_dir,
    )


@pytest.fixture(scope="module")
def open_worker(media_dir: Path, tiny_checkpoint: Path) -> Iterator[Worker]:
    """Private addresses allowed, 127.0.0.2 refused always, and only the listed hosts.

    127.0.0.2 and the metadata address are listed so that the address check refuses them, not the list.
    """
    limits = MediaLimits(
        allow_private_addresses=True,
        allowed_domains=("127.0.0.1", "127.0.0.2", "169.254.169.254"),
        denied_networks=("127.0.0.2/32",),
    )
    yield from start_worker(
        engine=make_engine(tiny_checkpoint, pipeline="text"),
        settings=tiny_settings(tiny_checkpoint, media=limits, max_tokens_limit=16),
        media_dir=media_dir,
    )


def _ask(worker: Worker, url: str, kind: str = "image_url") -> tuple[int, Any]:
    content = [{"type": kind, kind: {"url": url}}, {"type": "text", "text": "Describe."}]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 2}
    with worker.client() as client:
        response = client.post("/v1/chat/completions", json=body)
    return response.status_code, response.json()


def _refused(param: str = "messages[0].content[0].image_url.url") -> tuple[int, Any]:
    error = {"message": f"{param}: {GENERIC}", "type": "invalid_request_error", "param": param}
    return 400, {"error": {**error, "code": "media_fetch_failed"}}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_loopback_urls_are_refused_before_connecting(guarded: Worker, media: MediaServer) -> None:
    port = media.base.rsplit(":", 1)[1]
    before = len(media.hits)
    for url in (
        f"{media.base}/cat.png",
        f"http://localhost:{port}/cat.png",
        f"http://LOCALHOST.:{port}/cat.png",
        f"http://2130706433:{port}/cat.png",
        f"http://0177.0.0.1:{port}/cat.png",
        f"http://[::ffff:127.0.0.1]:{port}/cat.png",
        f"{guarded.url}/metrics",  # the worker's own endpoints
    ):
        assert _ask(guarded, url) == _refused(), url
    assert len(media.hits) == before  # nothing reached the server


def test_the_metadata_address_is_refused_for_every_media_kind(guarded: Worker, open_worker: Worker) -> None:
    started = time.monotonic()
    for worker in (guarded, open_worker):
        for kind in ("image_url", "audio_url", "video_url"):
            url = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"
            assert _ask(worker, url, kind) == _refused(f"messages[0].content[0].{kind}.url")
    assert time.monotonic() - started < 30  # refused at once, not six connection timeouts


def test_a_name_resolving_to_this_host_is_refused(guarded: Worker, media: MediaServer) -> None:
    """The machine's own name resolves (through the system resolver) to one of its addresses."""
    name = socket.gethostname()
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(name, None)}
    except OSError:
        pytest.skip(f"{name} does not resolve here")
    import ipaddress

    if all(ipaddress.ip_address(a.split("%")[0]).is_global for a in addresses):
        pytest.skip(f"{name} resolves to public addresses {addresses} here")
    port = media.base.rsplit(":", 1)[1]
    before = len(media.hits)
    assert _ask(guarded, f"http://{name}:{port}/cat.png") == _refused()
    assert len(media.hits) == before


def test_the_opt_out_and_the_allowed_domain(guarded: Worker, open_worker: Worker, media: MediaServer) -> None:
    status, body = _ask(open_worker, f"{media.base}/cat.png")
    assert status == 200, body  # the user's own media server, allowed by name and by the opt-out
    assert media.hits[-1] == "/cat.png"
    port = media.base.rsplit(":", 1)[1]
    before = len(media.hits)
    assert _ask(open_worker, f"http://localhost:{port}/cat.png") == _refused()  # not a listed domain
    assert len(media.hits) == before


def test_a_redirect_to_a_refused_address_is_refused(
    open_worker: Worker, media: MediaServer, other_media: MediaServer
) -> None:
    target = f"{other_media.base}/cat.png"
    assert _ask(open_worker, target) == _refused()  # refused directly
    assert _ask(open_worker, f"{media.base}/to?url={target}") == _refused()  # and behind a redirect
    assert media.hits[-1] == f"/to?url={target}"  # the first hop was fetched
    assert other_media.hits == []  # the redirect was not followed
    # A redirect to an allowed place is followed.
    assert _ask(open_worker, f"{media.base}/to?url=/cat.png")[0] == 200


def test_every_failure_reads_the_same(
    open_worker: Worker, media: MediaServer, other_media: MediaServer
) -> None:
    answers = {
        "refused address": _ask(open_worker, f"{other_media.base}/cat.png"),
        "metadata address": _ask(open_worker, "http://169.254.169.254/"),
        "closed port": _ask(open_worker, f"http://127.0.0.1:{_closed_port()}/cat.png"),
        "HTTP 403": _ask(open_worker, f"{media.base}/forbidden"),
        "HTTP 404": _ask(open_worker, f"{media.base}/missing"),
        "undecodable body": _ask(open_worker, f"{media.base}/garbage.png"),
    }
    assert answers == dict.fromkeys(answers, _refused())
