"""Remote media URLs, fetched so that a request cannot make the worker reach its own network.

A client's ``image_url`` is a request the worker makes on the client's behalf, from inside the
cluster. So every hop of a fetch is checked before a connection is made:

1. the scheme is http(s); the host is in ``--allowed-media-domain`` when that list is set;
2. the host is resolved once (``localhost`` and its subdomains are loopback without asking DNS;
   numeric forms like ``2130706433`` or ``0177.0.0.1`` are read as the IPv4 address they are);
3. every resolved address is classified (`classify`): loopback, private, shared (CGNAT),
   link-local (the cloud metadata address), unspecified, multicast, reserved or a deny-listed
   network refuse the whole hop, IPv4 addresses inside IPv6 ones (``::ffff:127.0.0.1``, NAT64,
   6to4) included;
4. the connection goes to a checked address (the URL's host replaced by it), with the original
   name in the Host header and as the TLS server name, so the certificate is still checked
   against the name and a DNS answer that changes after the check is never used;
5. redirects are followed here, at most ``max_redirects``, each Location checked as in 1-4.

Every refused or failed fetch answers the client with one message, `FETCH_FAILED_MESSAGE`
(refused address, closed port, HTTP error, timeout, undecodable body alike), so the answers do
not map the network; the reason goes to the worker log. Only a body over the byte cap says so
(413): the client needs it to send a smaller file, and it takes a reachable, allowed address.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from omni_runtime.media.errors import MEDIA_FETCH_FAILED, MEDIA_SOURCE_FORBIDDEN, MediaError
from omni_runtime.media.limits import MediaLimits, normalize_host, too_large

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# (host, port) -> the addresses the host resolves to. The system resolver in production; tests
# inject their own to name addresses without DNS.
Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]

FETCH_FAILED_MESSAGE = "could not fetch media from URL"

# Address classes (what `classify` returns).
LOOPBACK = "loopback"
PRIVATE = "private"
SHARED = "shared"  # 100.64.0.0/10, carrier-grade NAT
LINK_LOCAL = "link-local"
UNSPECIFIED = "unspecified"
MULTICAST = "multicast"
RESERVED = "reserved"
DENIED = "denied"  # in --deny-media-network
# The classes --allow-private-media-addresses lets through: the user's own network.
PRIVATE_CLASSES = frozenset({LOOPBACK, PRIVATE, SHARED})

_RANGES: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", UNSPECIFIED),
    ("127.0.0.0/8", LOOPBACK),
    ("10.0.0.0/8", PRIVATE),
    ("172.16.0.0/12", PRIVATE),
    ("192.168.0.0/16", PRIVATE),
    ("100.64.0.0/10", SHARED),
    ("169.254.0.0/16", LINK_LOCAL),
    ("224.0.0.0/4", MULTICAST),
    ("240.0.0.0/4", RESERVED),  # and 255.255.255.255
    ("192.0.0.0/24", RESERVED),
    ("192.0.2.0/24", RESERVED),
    ("198.18.0.0/15", RESERVED),
    ("198.51.100.0/24", RESERVED),
    ("203.0.113.0/24", RESERVED),
    ("::/128", UNSPECIFIED),
    ("::1/128", LOOPBACK),
    ("fc00::/7", PRIVATE),
    ("fe80::/10", LINK_LOCAL),
    ("fec0::/10", RESERVED),  # site-local, deprecated
    ("ff00::/8", MULTICAST),
    ("::/96", RESERVED),  # IPv4-compatible, deprecated
    ("100::/64", RESERVED),
    ("2001:db8::/32", RESERVED),
)
_NETWORKS = tuple((ipaddress.ip_network(cidr), kind) for cidr, kind in _RANGES)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NUMERIC_V4 = re.compile(r"^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}$")
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


def classify(ip: IPAddress) -> str | None:
    """The address class that refuses ``ip``, or None for a public (globally routable) address."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            return classify(embedded)
    for net, kind in _NETWORKS:
        if ip in net:
            return kind
    return None if ip.is_global else RESERVED


def refusal(ip: IPAddress, limits: MediaLimits) -> str | None:
    """Why ``ip`` may not be fetched from under ``limits``; None when it may."""
    for cidr in limits.denied_networks:
        net = ipaddress.ip_network(cidr)
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        if ip in net or (mapped is not None and mapped in net):
            return DENIED
    kind = classify(ip)
    if kind in PRIVATE_CLASSES and limits.allow_private_addresses:
        return None
    return kind


def domain_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    """``host`` (normalized) against normalized patterns: exact names, or ``*.suffix`` below suffix."""
    if not allowed:
        return True
    return any(host.endswith(p[1:]) if p.startswith("*.") else host == p for p in allowed)


def literal_address(host: str) -> IPAddress | None:
    """The address a host names without DNS: IPv4/IPv6 literals and inet_aton's numeric forms."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    if _NUMERIC_V4.match(host):  # 2130706433, 0177.0.0.1, 0x7f.1, 127.1: what the C resolver reads
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


class _Refused(Exception):
    """A hop the worker will not fetch; the text is for the log only."""


@dataclass(frozen=True)
class Hop:
    """One checked request: where to connect, and what to tell the server it is."""

    url: str  # as the client named it (redirects resolve against it)
    scheme: str
    host: str  # normalized name (or address text)
    port: int
    target: str  # path and query
    addresses: tuple[IPAddress, ...]  # every one checked

    def request_url(self, address: IPAddress) -> str:
        shown = f"[{address}]" if address.version == 6 else str(address)
        return f"{self.scheme}://{shown}:{self.port}{self.target}"

    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return shown if self.port == default else f"{shown}:{self.port}"

    def extensions(self) -> dict[str, str]:
        # TLS: the server name (SNI and certificate check) is the URL's name, not the address.
        if self.scheme == "https" and literal_address(self.host) is None:
            return {"sni_hostname": self.host}
        return {}


async def check_hop(url: str, *, limits: MediaLimits, resolver: Resolver) -> Hop:
    """Parse, resolve and check one URL; `_Refused` says why not."""
    try:
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        host = normalize_host(parts.hostname or "")
        port = parts.port or (443 if scheme == "https" else 80)
    except (ValueError, UnicodeError) as exc:
        raise _Refused(f"unparseable URL: {exc}") from None
    if scheme not in ("http", "https"):
        raise _Refused(f"scheme {scheme!r} is not http(s)")
    if not host:
        raise _Refused("no host")
    if not domain_allowed(host, limits.allowed_domains):
        raise _Refused(f"host {host} is not in --allowed-media-domain {list(limits.allowed_domains)}")
    literal = literal_address(host)
    if literal is not None:
        addresses = [literal]
    elif host == "localhost" or host.endswith(".localhost"):  # RFC 6761: loopback, whatever DNS says
        addresses = [ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv6Address("::1")]
    else:
        try:
            async with asyncio.timeout(limits.fetch_timeout_s):
                addresses = await resolver(host, port)
        except (OSError, TimeoutError, UnicodeError, ValueError) as exc:
            raise _Refused(f"cannot resolve {host}: {exc!r}") from None
        if not addresses:
            raise _Refused(f"{host} resolves to no address")
    for address in addresses:
        reason = refusal(address, limits)
        if reason is not None:
            raise _Refused(f"{host} resolves to {address} ({reason})")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Hop(url, scheme, host, port, target, tuple(dict.fromkeys(addresses)))


def fetch_failed() -> MediaError:
    """The one answer a client gets for any URL the worker refused or could not fetch or decode."""
    return MediaError(FETCH_FAILED_MESSAGE, code=MEDIA_FETCH_FAILED)


async def fetch_url(
    url: str,
    *,
    limits: MediaLimits,
    client: httpx.AsyncClient | None = None,
    resolver: Resolver = system_resolver,
) -> bytes:
    """Download an http(s) URL under the address checks, byte cap and timeout."""
    if not limits.allow_remote_urls:
        raise MediaError(
            "remote media URLs are disabled on this worker; send the media inline as a data: URI",
            code=MEDIA_SOURCE_FORBIDDEN,
        )
    own_client = client is None
    # No proxies from the environment (they would resolve the name themselves), no redirects
    # followed by httpx, no connection kept for the next hop (its TLS name was another's).
    http = client or httpx.AsyncClient(
        timeout=limits.fetch_timeout_s,
        follow_redirects=False,
        trust_env=False,
        limits=httpx.Limits(max_keepalive_connections=0),
    )
    try:
        return await _follow(url, limits=limits, http=http, resolver=resolver)
    except _Refused as exc:
        log.warning("media URL not fetched: %s: %s", url, exc)
    except httpx.TimeoutException as exc:
        log.warning("media fetch timed out after %g s: %s: %r", limits.fetch_timeout_s, url, exc)
    except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
        log.warning("media fetch failed: %s: %r", url, exc)
    finally:
        if own_client:
            await http.aclose()
    raise fetch_failed()


async def _follow(url: str, *, limits: MediaLimits, http: httpx.AsyncClient, resolver: Resolver) -> bytes:
    current = url
    for _ in range(limits.max_redirects + 1):
        hop = await check_hop(current, limits=limits, resolver=resolver)
        location = await _get(hop, limits=limits, http=http)
        if isinstance(location, bytes):
            return location
        current = urllib.parse.urljoin(hop.url, location)
    raise _Refused(f"more than {limits.max_redirects} redirects")


async def _get(hop: Hop, *, limits: MediaLimits, http: httpx.AsyncClient) -> bytes | str:
    """The body of a 2xx, or the Location of a redirect; anything else is `_Refused`."""
    last_error: Exception | None = None
    for address in hop.addresses:  # every one checked; the next when one does not answer
        try:
            async with http.stream(
                "GET",
                hop.request_url(address),
                headers={"Host": hop.host_header()},
                extensions=hop.extensions(),
                follow_redirects=False,
                timeout=limits.fetch_timeout_s,
            ) as response:
                location = response.headers.get("location")
                if response.status_code in _REDIRECTS and location:
                    return location
                if not 200 <= response.status_code < 300:
                    raise _Refused(f"HTTP {response.status_code} from {address}")
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > limits.max_bytes:
                    raise too_large(int(declared), limits)
                body = bytearray()
                async for piece in response.aiter_bytes():
                    body += piece
                    if len(body) > limits.max_bytes:
                        raise too_large(len(body), limits)
                return bytes(body)
        except httpx.ConnectError as exc:
            last_error = exc
    raise _Refused(f"no address of {hop.host} answered: {last_error!r}")
