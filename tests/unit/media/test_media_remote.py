"""Remote media fetches cannot reach the worker's network: the address classifier, the per-hop
check (after resolution, on every redirect), the pinned connection, and one answer for every failure.

The fetch tests run real HTTP(S) servers on loopback. Loopback is itself a refused address, so a
test that needs a hop to succeed turns on ``allow_private_addresses`` and refuses the address it
is about with ``denied_networks`` (127.0.0.2 is loopback too on Linux: every 127/8 address is).
Names are resolved by an injected resolver where a test needs a name to mean an address; the
production path calls the same `fetch_url` with the system resolver.
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from omni_runtime.media import MediaError, MediaLimits, load_image
from omni_runtime.media.errors import MEDIA_FETCH_FAILED
from omni_runtime.media.limits import domain_pattern, network
from omni_runtime.media.remote import (
    FETCH_FAILED_MESSAGE,
    IPAddress,
    _Refused,
    check_hop,
    classify,
    domain_allowed,
    fetch_url,
    literal_address,
    refusal,
    system_resolver,
)

ip = ipaddress.ip_address
DEFAULT = MediaLimits()
OPT_OUT = MediaLimits(allow_private_addresses=True)


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("93.184.215.14", None),
        ("8.8.8.8", None),
        ("127.0.0.1", "loopback"),
        ("127.255.255.254", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("172.32.0.1", None),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "shared"),
        ("100.127.255.255", "shared"),
        ("169.254.169.254", "link-local"),  # the cloud metadata address
        ("169.254.0.1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        ("192.0.2.1", "reserved"),
        ("198.18.0.1", "reserved"),
        ("2606:4700::1111", None),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fc00::1", "private"),
        ("fd00:ec2::254", "private"),  # AWS's IPv6 metadata address
        ("fe80::1", "link-local"),
        ("fec0::1", "reserved"),
        ("ff02::1", "multicast"),
        ("2001:db8::1", "reserved"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
        ("::ffff:169.254.169.254", "link-local"),
        ("::ffff:10.0.0.1", "private"),
        ("::ffff:8.8.8.8", None),
        ("::7f00:1", "reserved"),  # IPv4-compatible ::127.0.0.1 (deprecated)
        ("64:ff9b::a00:1", "private"),  # NAT64 of 10.0.0.1
        ("64:ff9b::808:808", None),  # NAT64 of 8.8.8.8
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
        ("2002:a9fe:a9fe::", "link-local"),  # 6to4 of 169.254.169.254
        ("2001::1", "reserved"),  # Teredo
    ],
)
def test_classify(address: str, expected: str | None) -> None:
    assert classify(ip(address)) == expected


@pytest.mark.parametrize(
    ("address", "allow_private", "denied", "expected"),
    [
        ("127.0.0.1", False, (), "loopback"),
        ("127.0.0.1", True, (), None),
        ("10.0.0.1", True, (), None),
        ("fd00::1", True, (), None),
        ("100.64.0.1", True, (), None),
        ("169.254.169.254", True, (), "link-local"),  # the opt-out never opens the metadata address
        ("fe80::1", True, (), "link-local"),
        ("0.0.0.0", True, (), "unspecified"),
        ("224.0.0.1", True, (), "multicast"),
        ("127.0.0.2", True, ("127.0.0.2/32",), "denied"),
        ("10.96.0.10", True, ("10.96.0.0/12",), "denied"),
        ("10.112.0.1", True, ("10.96.0.0/12",), None),
        ("::ffff:10.96.0.10", True, ("10.96.0.0/12",), "denied"),
        ("34.118.224.1", False, ("34.118.224.0/20",), "denied"),  # a cluster range in public space
        ("34.118.240.1", False, ("34.118.224.0/20",), None),
        ("8.8.8.8", False, ("fd00::/8",), None),
    ],
)
def test_refusal_with_opt_out_and_denied_networks(
    address: str, allow_private: bool, denied: tuple[str, ...], expected: str | None
) -> None:
    limits = MediaLimits(allow_private_addresses=allow_private, denied_networks=denied)
    assert refusal(ip(address), limits) == expected


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),  # decimal
        ("0177.0.0.1", "127.0.0.1"),  # octal
        ("0x7f.0.0.1", "127.0.0.1"),  # hex
        ("0x7f000001", "127.0.0.1"),
        ("127.1", "127.0.0.1"),  # short forms
        ("10.1", "10.0.0.1"),
        ("0", "0.0.0.0"),
        ("::1", "::1"),
        ("::ffff:127.0.0.1", "::ffff:7f00:1"),
        ("fe80::1%eth0", "fe80::1"),
        ("example.com", None),
        ("face.bad", None),  # hex letters only, still a name
        ("1.2.3.4.5", None),
        ("08.0.0.1", None),  # not octal, not decimal: the C resolver refuses it too
    ],
)
def test_literal_address(host: str, expected: str | None) -> None:
    got = literal_address(host)
    assert (str(got) if got is not None else None) == expected


@pytest.mark.parametrize(
    ("host", "allowed", "expected"),
    [
        ("media.example.com", (), True),
        ("media.example.com", ("media.example.com",), True),
        ("cdn.media.example.com", ("media.example.com",), False),
        ("media.example.com", ("*.example.com",), True),
        ("a.b.example.com", ("*.example.com",), True),
        ("example.com", ("*.example.com",), False),
        ("badexample.com", ("*.example.com",), False),
        ("example.com.evil.net", ("example.com",), False),
        ("127.0.0.1", ("127.0.0.1",), True),
        ("other.org", ("media.example.com", "*.other.org"), False),
    ],
)
def test_domain_allowed(host: str, allowed: tuple[str, ...], expected: bool) -> None:
    assert domain_allowed(host, allowed) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Media.Example.COM.", "media.example.com"),
        ("*.Example.com", "*.example.com"),
        ("bücher.example", "xn--bcher-kva.example"),
        ("127.0.0.1", "127.0.0.1"),
        ("", ValueError),
        ("*.", ValueError),
        ("a b.com", ValueError),
        ("*.*.example.com", ValueError),
        ("-bad.example.com", ValueError),
        ("http://example.com", ValueError),
    ],
)
def test_domain_pattern(text: str, expected: object) -> None:
    if expected is ValueError:
        with pytest.raises(ValueError, match="--allowed-media-domain"):
            domain_pattern(text)
    else:
        assert domain_pattern(text) == expected


def test_network_and_limits_normalize_their_lists() -> None:
    assert network("10.96.0.1/12") == "10.96.0.0/12"
    assert network("fd00::1") == "fd00::1/128"
    with pytest.raises(ValueError, match="--deny-media-network 'ten' is not an address or CIDR range"):
        network("ten")
    limits = MediaLimits(allowed_domains=("Media.Example.com.",), denied_networks=("10.96.0.1/12",))
    assert (limits.allowed_domains, limits.denied_networks) == (("media.example.com",), ("10.96.0.0/12",))


class FakeDns:
    """A resolver from a table, counting calls; a name not in it does not resolve."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.calls: list[str] = []

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.calls.append(host)
        if host not in self.table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [ip(a) for a in self.table[host]]


DNS = {
    "public.test": ["93.184.215.14"],
    "dual.test": ["93.184.215.14", "2606:2800:21f::1"],
    "mixed.test": ["93.184.215.14", "10.0.0.7"],  # one private answer refuses the whole name
    "metadata.google.internal": ["169.254.169.254"],
    "rebind.test": ["127.0.0.1"],
    "v6private.test": ["fd12::1"],
}


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://public.test/a.png", ("93.184.215.14",)),
        ("http://PUBLIC.test./a.png", ("93.184.215.14",)),  # trailing dot, case
        ("https://dual.test/a.png", ("93.184.215.14", "2606:2800:21f::1")),
        ("http://8.8.8.8/a.png", ("8.8.8.8",)),
        ("http://127.0.0.1/", "127.0.0.1 resolves to 127.0.0.1 (loopback)"),
        ("http://2130706433/", "2130706433 resolves to 127.0.0.1 (loopback)"),
        ("http://0177.0.0.1/", "0177.0.0.1 resolves to 127.0.0.1 (loopback)"),
        ("http://0x7f.1:8000/admin/workers", "0x7f.1 resolves to 127.0.0.1 (loopback)"),
        ("http://[::1]:8000/metrics", "::1 resolves to ::1 (loopback)"),
        ("http://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1 resolves to ::ffff:7f00:1 (loopback)"),
        ("http://localhost:8000/", "localhost resolves to 127.0.0.1 (loopback)"),
        ("http://LocalHost./", "localhost resolves to 127.0.0.1 (loopback)"),
        ("http://api.localhost/", "api.localhost resolves to 127.0.0.1 (loopback)"),
        (
            "http://169.254.169.254/latest/meta-data/",
            "169.254.169.254 resolves to 169.254.169.254 (link-local)",
        ),
        (
            "http://metadata.google.internal/computeMetadata/v1/",
            "metadata.google.internal resolves to 169.254.169.254 (link-local)",
        ),
        ("http://mixed.test/", "mixed.test resolves to 10.0.0.7 (private)"),
        ("http://rebind.test/", "rebind.test resolves to 127.0.0.1 (loopback)"),
        ("http://v6private.test/", "v6private.test resolves to fd12::1 (private)"),
        ("http://100.64.1.1/", "100.64.1.1 resolves to 100.64.1.1 (shared)"),
        ("http://[fe80::1]/", "fe80::1 resolves to fe80::1 (link-local)"),
        ("http://0.0.0.0:8000/", "0.0.0.0 resolves to 0.0.0.0 (unspecified)"),
        ("http://unknown.test/", "cannot resolve unknown.test: gaierror(-2, 'Name or service not known')"),
        ("ftp://public.test/a.png", "scheme 'ftp' is not http(s)"),
        ("file:///etc/passwd", "scheme 'file' is not http(s)"),
        ("http:///a.png", "no host"),
        ("http://public.test:99999/", "unparseable URL: Port out of range 0-65535"),
    ],
)
async def test_check_hop(url: str, expected: tuple[str, ...] | str) -> None:
    if isinstance(expected, tuple):
        hop = await check_hop(url, limits=DEFAULT, resolver=FakeDns(DNS))
        assert tuple(str(a) for a in hop.addresses) == expected
    else:
        with pytest.raises(_Refused) as caught:
            await check_hop(url, limits=DEFAULT, resolver=FakeDns(DNS))
        assert str(caught.value) == expected


async def test_literals_and_localhost_never_ask_dns() -> None:
    dns = FakeDns({"localhost": ["93.184.215.14"], "2130706433": ["93.184.215.14"]})  # a lying resolver
    for url in ("http://localhost/", "http://2130706433/", "http://[::1]/", "http://10.0.0.1/"):
        with pytest.raises(_Refused):
            await check_hop(url, limits=DEFAULT, resolver=dns)
    assert dns.calls == []


async def test_allowed_domains_are_checked_before_resolving() -> None:
    limits = MediaLimits(allowed_domains=("*.media.test", "public.test"))
    dns = FakeDns({**DNS, "cdn.media.test": ["93.184.215.14"]})
    assert (await check_hop("http://cdn.media.test/a", limits=limits, resolver=dns)).host == "cdn.media.test"
    assert (await check_hop("http://public.test/a", limits=limits, resolver=dns)).host == "public.test"
    with pytest.raises(_Refused) as caught:
        await check_hop("http://dual.test/a", limits=limits, resolver=dns)
    assert (
        str(caught.value) == "host dual.test is not in --allowed-media-domain ['*.media.test', 'public.test']"
    )
    assert dns.calls == ["cdn.media.test", "public.test"]
    # An allowed name still has its addresses checked.
    with pytest.raises(_Refused, match="loopback"):
        await check_hop(
            "http://x.media.test/", limits=limits, resolver=FakeDns({"x.media.test": ["127.0.0.1"]})
        )


async def test_hop_connects_to_the_checked_address_with_the_original_name() -> None:
    hop = await check_hop("https://dual.test:8443/a/b.png?x=1#frag", limits=DEFAULT, resolver=FakeDns(DNS))
    assert hop.request_url(hop.addresses[0]) == "https://93.184.215.14:8443/a/b.png?x=1"
    assert hop.request_url(hop.addresses[1]) == "https://[2606:2800:21f::1]:8443/a/b.png?x=1"
    assert (hop.host_header(), hop.extensions()) == ("dual.test:8443", {"sni_hostname": "dual.test"})
    plain = await check_hop("http://user:pw@public.test/a.png", limits=DEFAULT, resolver=FakeDns(DNS))
    assert (plain.request_url(plain.addresses[0]), plain.host_header(), plain.extensions()) == (
        "http://93.184.215.14:80/a.png",
        "public.test",
        {},
    )
    literal = await check_hop("https://8.8.8.8/a.png", limits=DEFAULT, resolver=FakeDns(DNS))
    assert (literal.host_header(), literal.extensions()) == ("8.8.8.8", {})  # no SNI for an address


# ---- real servers ------------------------------------------------------------------------


class _Media(http.server.BaseHTTPRequestHandler):
    """/small, /garbage (200, not an image), /forbidden (403), /slow, /to?url=X (302 to X), /loop."""

    hits: list[tuple[str, str]]  # (path, Host header), set per server class

    def do_GET(self) -> None:
        self.hits.append((self.path, self.headers.get("Host", "")))
        if self.path in ("/small", "/garbage"):
            body = b"0123456789"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/forbidden":
            self.send_error(403)
        elif self.path == "/slow":
            time.sleep(1.5)
            self.send_error(404)
        elif self.path.startswith("/to?url="):
            self.send_response(302)
            self.send_header("Location", self.path[len("/to?url=") :])
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/loop":
            self.send_response(301)
            self.send_header("Location", "/loop")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.send_error(404)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _serve(host: str, context: ssl.SSLContext | None = None) -> Iterator[tuple[int, list[tuple[str, str]]]]:
    hits: list[tuple[str, str]] = []
    handler = type("Handler", (_Media,), {"hits": hits})
    server = http.server.ThreadingHTTPServer((host, 0), handler)
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], hits
    server.shutdown()
    server.server_close()


@pytest.fixture
def first() -> Iterator[tuple[int, list[tuple[str, str]]]]:
    yield from _serve("127.0.0.1")


@pytest.fixture
def second() -> Iterator[tuple[int, list[tuple[str, str]]]]:
    yield from _serve("127.0.0.2")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket is closed


async def _fails(url: str, limits: MediaLimits, **kw: object) -> MediaError:
    with pytest.raises(MediaError) as caught:
        await fetch_url(url, limits=limits, **kw)  # type: ignore[arg-type]
    return caught.value


async def test_loopback_and_metadata_are_refused_before_connecting(first) -> None:
    port, hits = first
    for url in (
        f"http://127.0.0.1:{port}/small",
        f"http://localhost:{port}/small",
        f"http://2130706433:{port}/small",
    ):
        error = await _fails(url, DEFAULT)
        assert (str(error), error.code, error.status) == (FETCH_FAILED_MESSAGE, MEDIA_FETCH_FAILED, 400)
    assert hits == []
    started = time.monotonic()
    await _fails("http://169.254.169.254/latest/meta-data/", OPT_OUT)  # even with the opt-out
    assert time.monotonic() - started < 1.0  # refused, not a connection attempt that timed out


async def test_a_name_resolving_to_a_private_address_is_refused(first) -> None:
    port, hits = first
    dns = FakeDns({"media.test": ["127.0.0.1"]})
    await _fails(f"http://media.test:{port}/small", DEFAULT, resolver=dns)
    assert (dns.calls, hits) == (["media.test"], [])
    # The same name and server with the opt-out: the fetch goes through, so the refusal above was the check.
    assert await fetch_url(f"http://media.test:{port}/small", limits=OPT_OUT, resolver=dns) == b"0123456789"


async def test_the_connection_goes_to_the_checked_address_with_the_name_as_host(first) -> None:
    port, hits = first
    dns = FakeDns({"media.test": ["127.0.0.1"]})
    assert await fetch_url(f"http://media.test:{port}/small", limits=OPT_OUT, resolver=dns) == b"0123456789"
    # One lookup, by our resolver: `.test` names do not exist in DNS, so httpx did not resolve it
    # again; the server saw the URL's name.
    assert dns.calls == ["media.test"]
    assert hits == [("/small", f"media.test:{port}")]


async def test_the_first_checked_address_that_answers_is_used(first) -> None:
    port, hits = first
    dns = FakeDns({"media.test": ["127.0.0.3", "127.0.0.1"]})  # nothing listens on 127.0.0.3
    assert await fetch_url(f"http://media.test:{port}/small", limits=OPT_OUT, resolver=dns) == b"0123456789"
    assert hits == [("/small", f"media.test:{port}")]


async def test_every_redirect_hop_is_checked_again(first, second) -> None:
    port, hits = first
    port2, hits2 = second
    # The first hop (127.0.0.1) is allowed; 127.0.0.2 is refused like a private address would be.
    limits = MediaLimits(allow_private_addresses=True, denied_networks=("127.0.0.2/32",))
    target = f"http://127.0.0.2:{port2}/small"
    await _fails(target, limits)  # refused directly ...
    await _fails(f"http://127.0.0.1:{port}/to?url={target}", limits)  # ... and behind a redirect
    assert hits == [("/to?url=" + target, f"127.0.0.1:{port}")]
    assert hits2 == []  # the redirect target was never contacted
    # Redirects are followed when the next hop passes: relative and absolute.
    assert await fetch_url(f"http://127.0.0.1:{port}/to?url=/small", limits=limits) == b"0123456789"
    assert await fetch_url(f"http://127.0.0.1:{port}/to?url={target}", limits=OPT_OUT) == b"0123456789"
    # The allowed-domain list is checked on every hop too: 127.0.0.1 is listed, localhost is not.
    listed = MediaLimits(allow_private_addresses=True, allowed_domains=("127.0.0.1",))
    assert await fetch_url(f"http://127.0.0.1:{port}/small", limits=listed) == b"0123456789"
    hits.clear()
    await _fails(f"http://127.0.0.1:{port}/to?url=http://localhost:{port}/small", listed)
    assert [path for path, _ in hits] == [f"/to?url=http://localhost:{port}/small"]


async def test_redirects_are_bounded(first) -> None:
    port, hits = first
    await _fails(f"http://127.0.0.1:{port}/loop", MediaLimits(allow_private_addresses=True, max_redirects=3))
    assert len(hits) == 4  # the first request and three redirects


async def test_one_message_for_every_failure(first, caplog: pytest.LogCaptureFixture) -> None:
    port, _ = first
    slow = MediaLimits(allow_private_addresses=True, fetch_timeout_s=0.3, denied_networks=("127.0.0.2/32",))
    errors = {
        "refused address": await _fails(f"http://127.0.0.2:{port}/small", slow),
        "metadata address": await _fails("http://169.254.169.254/", slow),
        "closed port": await _fails(f"http://127.0.0.1:{_closed_port()}/small", slow),
        "HTTP 403": await _fails(f"http://127.0.0.1:{port}/forbidden", slow),
        "HTTP 404": await _fails(f"http://127.0.0.1:{port}/missing", slow),
        "timeout": await _fails(f"http://127.0.0.1:{port}/slow", slow),
        "no such name": await _fails("http://nowhere.test/a.png", slow, resolver=FakeDns({})),
        "bad URL": await _fails("http://[::1/a.png", slow),
    }
    with pytest.raises(MediaError) as undecodable:  # 200 with a body that is not an image
        await load_image(f"http://127.0.0.1:{port}/garbage", limits=slow)
    errors["undecodable body"] = undecodable.value
    answers = {name: (e.message, e.code, e.status, e.param) for name, e in errors.items()}
    assert set(answers.values()) == {(FETCH_FAILED_MESSAGE, MEDIA_FETCH_FAILED, 400, None)}, answers
    # The reasons are in the worker's log.
    logged = caplog.text
    for fragment in ("(denied)", "(link-local)", "ConnectError", "HTTP 403", "timed out", "does not decode"):
        assert fragment in logged


async def test_https_is_pinned_with_the_name_as_tls_server_name(tmp_path: Path) -> None:
    """The connection goes to the checked address; the certificate is still checked against the name."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "media.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("media.test")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem, key_pem = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert_pem, key_pem)
    seen_sni: list[str | None] = []
    server_ctx.sni_callback = lambda _sock, sni, _ctx: seen_sni.append(sni)  # type: ignore[assignment,misc]
    client_ctx = ssl.create_default_context(cafile=str(cert_pem))
    served = _serve("127.0.0.1", server_ctx)
    port, hits = next(served)
    try:
        dns = FakeDns({"media.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
        async with httpx.AsyncClient(verify=client_ctx, trust_env=False) as client:
            body = await fetch_url(
                f"https://media.test:{port}/small", limits=OPT_OUT, resolver=dns, client=client
            )
            assert body == b"0123456789"
            # The same address under a name the certificate does not carry fails verification.
            await _fails(f"https://other.test:{port}/small", OPT_OUT, resolver=dns, client=client)
        assert seen_sni[:2] == ["media.test", "other.test"]
        assert hits == [("/small", f"media.test:{port}")]
    finally:
        next(served, None)


async def test_the_system_resolver_answers_addresses() -> None:
    assert ip("127.0.0.1") in await system_resolver("localhost", 80) or ip("::1") in await system_resolver(
        "localhost", 80
    )
