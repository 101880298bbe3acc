"""Configurable limits on client media, so one request cannot exhaust a worker or reach its network.

Every limit is enforced before the expensive step it protects: byte caps before download or
base64 decoding finishes, pixel caps before an image is decoded, duration caps from container
metadata before frames are decoded. Remote URLs are checked before any connection is made
(`omni_runtime.media.remote`): which domains, and which addresses those names resolve to.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from omni_runtime.media.errors import MEDIA_TOO_LARGE, MediaError

# Qwen2.5-Omni's video defaults (qwen-omni-utils): 2 fps sampling, at most 768 x 28 x 28 pixels per frame.
DEFAULT_VIDEO_FPS = 2.0
DEFAULT_VIDEO_MAX_PIXELS = 768 * 28 * 28

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


def normalize_host(host: str) -> str:
    """A host name as DNS compares it: lower case, IDNA (punycode), no trailing dot."""
    name = host.strip().rstrip(".").lower()
    if name and not name.isascii():
        name = name.encode("idna").decode("ascii")
    return name


def domain_pattern(text: str) -> str:
    """``media.example.com`` (that host) or ``*.example.com`` (any name below it), normalized."""
    wildcard = text.strip().startswith("*.")
    try:
        name = normalize_host(text.strip()[2:] if wildcard else text)
    except UnicodeError as exc:
        raise ValueError(f"--allowed-media-domain {text!r} is not a valid host name") from exc
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise ValueError(
            f"--allowed-media-domain {text!r} is not a host name or *.suffix (e.g. media.example.com, "
            "*.example.com)"
        )
    return f"*.{name}" if wildcard else name


def network(text: str) -> str:
    """A CIDR (``10.96.0.0/12``, ``fd00::/8``) or a single address, normalized."""
    try:
        return str(ipaddress.ip_network(text.strip(), strict=False))
    except ValueError as exc:
        raise ValueError(f"--deny-media-network {text!r} is not an address or CIDR range") from exc


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
    # Remote URLs only to these hosts when any are named: exact names or "*.suffix" (names below it).
    allowed_domains: tuple[str, ...] = ()
    # Loopback, private (RFC 1918, fc00::/7) and shared (100.64/10) addresses are refused unless
    # this is set; link-local (the cloud metadata address), multicast, reserved and the
    # deny-listed networks are refused always.
    allow_private_addresses: bool = False
    # More ranges refused always: the cluster's pod and Service ranges where they are public space.
    denied_networks: tuple[str, ...] = ()
    max_redirects: int = 3  # each hop is checked again before it is followed
    # Local paths (and file:// URLs) are read only below this directory; None disables them,
    # because a path is a way to read the worker's own files.
    allowed_local_media_path: str | None = None

    def __post_init__(self) -> None:
        # Normalized once, so every fetch compares like with like; a bad entry is a ValueError.
        object.__setattr__(self, "allowed_domains", tuple(domain_pattern(d) for d in self.allowed_domains))
        object.__setattr__(self, "denied_networks", tuple(network(n) for n in self.denied_networks))


def too_large(size: int, limits: MediaLimits) -> MediaError:
    return MediaError(
        f"the media is {size} bytes; this worker accepts at most {limits.max_bytes} bytes per item "
        "(send a smaller file, or raise --max-media-bytes)",
        code=MEDIA_TOO_LARGE,
        status=413,
    )
