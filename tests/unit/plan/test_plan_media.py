"""spec.media in the plan: `omni serve` flags on the worker API process only, normalized denied
ranges for the egress policy, and a worker revision that moves only when media is set."""

from __future__ import annotations

import hashlib
import json

import pydantic
import pytest
from spec_builders import deployment

from omni_operator.plan import plan_deployment, worker_revision
from omni_operator.plan.types import Role

MEDIA = {
    "media.allowedDomains": ["media.example.com", "*.cdn.example.net"],
    "media.allowPrivateAddresses": True,
    "media.deniedNetworks": ["34.118.224.1/20", "fd00:10::/64"],
}
FLAGS = [
    "--allowed-media-domain",
    "media.example.com",
    "--allowed-media-domain",
    "*.cdn.example.net",
    "--allow-private-media-addresses",
    "--deny-media-network",
    "34.118.224.1/20",
    "--deny-media-network",
    "fd00:10::/64",
]


def _flags(command: tuple[str, ...]) -> list[str]:
    return [
        part
        for i, part in enumerate(command)
        if part.startswith(
            ("--allowed-media-domain", "--allow-private-media-addresses", "--deny-media-network")
        )
        or command[i - 1] in ("--allowed-media-domain", "--deny-media-network")
    ]


def test_media_flags_go_to_the_serve_process_only() -> None:
    plan = plan_deployment(deployment(**{"model.name": "Qwen2.5-Omni-7B", **MEDIA}))
    pods = {p.role: p for p in plan.workers[0].pods}
    assert pods[Role.api].container.command[:2] == ("omni", "serve")
    assert _flags(pods[Role.api].container.command) == FLAGS
    for role in (Role.thinker, Role.talker):  # `omni stage` fetches no media
        assert _flags(pods[role].container.command) == []
    cpu = plan_deployment(deployment(**{"gpu.tier": "cpu", **MEDIA}))
    assert _flags(cpu.workers[0].pods[0].container.command) == FLAGS


def test_extra_args_come_after_the_media_flags() -> None:
    plan = plan_deployment(
        deployment(**{"gpu.tier": "cpu", **MEDIA, "runtime.extraArgs": ["--log-level", "debug"]})
    )
    command = plan.workers[0].pods[0].container.command
    assert command[-11:] == (*FLAGS, "--log-level", "debug")


def test_denied_networks_are_normalized_for_the_policy() -> None:
    assert plan_deployment(deployment(**MEDIA)).denied_networks == ("34.118.224.0/20", "fd00:10::/64")
    assert plan_deployment(deployment()).denied_networks == ()


def test_worker_revision_moves_only_when_media_is_set() -> None:
    base = deployment(**{"model.name": "Qwen2.5-Omni-7B"})
    # The revision of a spec without media is what it was before spec.media existed (and before
    # spec.runtime.env, which counts only when set too: test_plan_runtime_env pins the hashes).
    shaping = base.spec.model_dump(
        mode="json",
        by_alias=True,
        include={"model", "runtime", "pipeline", "stages", "gpu"},
        exclude={"runtime": {"env"}},
    )
    canonical = json.dumps(shaping, sort_keys=True, separators=(",", ":"), default=str)
    assert worker_revision(base.spec) == hashlib.sha256(canonical.encode()).hexdigest()[:10]
    with_media = deployment(**{"model.name": "Qwen2.5-Omni-7B", **MEDIA})
    assert worker_revision(with_media.spec) != worker_revision(base.spec)
    before, after = plan_deployment(base), plan_deployment(with_media)
    old = {p.role: p.revision for p in before.workers[0].pods}
    new = {p.role: p.revision for p in after.workers[0].pods}
    assert old[Role.api] != new[Role.api]
    assert (old[Role.thinker], old[Role.talker]) == (new[Role.thinker], new[Role.talker])


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        ({"media.allowedDomains": ["https://media.example.com"]}, "String should match pattern"),
        ({"media.allowedDomains": ["Media.Example.com"]}, "String should match pattern"),
        ({"media.allowedDomains": ["*"]}, "String should match pattern"),
        (
            {"media.deniedNetworks": ["10.0.0.0/33"]},
            "deniedNetworks: '10.0.0.0/33' is not an address or CIDR range",
        ),
        ({"media.deniedNetworks": ["ten"]}, "String should match pattern"),
        ({"media.allowPrivate": True}, "Extra inputs are not permitted"),
    ],
)
def test_bad_media_settings_are_refused(settings: dict[str, object], fragment: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="media") as caught:
        deployment(**settings)
    assert fragment in str(caught.value)
