"""`omni serve`'s remote-media flags: the MediaLimits they make, and exit 2 naming the flag for bad values."""

from __future__ import annotations

import pytest

from omni_runtime.entrypoints.serve import main, parse_args
from omni_runtime.media.limits import MediaLimits


def test_remote_media_defaults_refuse_private_addresses_and_allow_any_public_host() -> None:
    limits = parse_args([]).limits
    assert (limits.allow_remote_urls, limits.allowed_domains, limits.allow_private_addresses) == (
        True,
        (),
        False,
    )
    assert limits.denied_networks == ()


def test_remote_media_flags_map_to_limits() -> None:
    config = parse_args(
        [
            "--allowed-media-domain",
            "Media.Example.com",
            "--allowed-media-domain",
            "*.cdn.example.net.",
            "--allow-private-media-addresses",
            "--deny-media-network",
            "10.96.0.0/12",
            "--deny-media-network",
            "fd00:10::1",
        ]
    )
    assert config.limits == MediaLimits(
        allowed_domains=("media.example.com", "*.cdn.example.net"),
        allow_private_addresses=True,
        denied_networks=("10.96.0.0/12", "fd00:10::1/128"),
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--allowed-media-domain", "https://example.com"],
            "--allowed-media-domain 'https://example.com' is not a host name or *.suffix",
        ),
        (["--allowed-media-domain", "*"], "--allowed-media-domain '*' is not a host name or *.suffix"),
        (
            ["--deny-media-network", "10.0.0.0/33"],
            "--deny-media-network '10.0.0.0/33' is not an address or CIDR",
        ),
    ],
)
def test_bad_remote_media_flags_exit_2_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    assert message in capsys.readouterr().err
