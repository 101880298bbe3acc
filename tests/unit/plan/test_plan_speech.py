"""spec.speech in the plan: `--max-speech-streams` on the worker API process when set, nothing when
unset (the runtime's default), and a clear error for a negative limit."""

from __future__ import annotations

import pydantic
import pytest
from spec_builders import deployment, flag

from omni_operator.plan import plan_deployment
from omni_operator.plan.types import Role


@pytest.mark.parametrize(
    ("value", "flags"), [(None, []), (0, ["--max-speech-streams", "0"]), (8, ["--max-speech-streams", "8"])]
)
def test_speech_limit_goes_to_the_serve_process_only(value: int | None, flags: list[str]) -> None:
    extra = {} if value is None else {"speech.maxStreams": value}
    plan = plan_deployment(deployment(**{"model.name": "Qwen2.5-Omni-7B", **extra}))
    pods = {p.role: p for p in plan.workers[0].pods}
    assert pods[Role.api].container.command[:2] == ("omni", "serve")
    assert flag(pods[Role.api].container.command, "--max-speech-streams") == flags
    for role in (Role.thinker, Role.talker):  # `omni stage` admits nothing
        assert flag(pods[role].container.command, "--max-speech-streams") == []
    cpu = plan_deployment(deployment(**{"gpu.tier": "cpu", **extra}))
    assert flag(cpu.workers[0].pods[0].container.command, "--max-speech-streams") == flags


def test_negative_limit_is_refused_naming_the_field() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"speech\.maxStreams|speech.max_streams"):
        deployment(**{"speech.maxStreams": -1})


def test_worker_revision_moves_only_when_the_speech_limit_is_set() -> None:
    from omni_operator.plan import worker_revision

    base = deployment(**{"model.name": "Qwen2.5-Omni-7B"})
    limited = deployment(**{"model.name": "Qwen2.5-Omni-7B", "speech.maxStreams": 8})
    other = deployment(**{"model.name": "Qwen2.5-Omni-7B", "speech.maxStreams": 4})
    # Unset, the revision is the one from before spec.speech existed: test_plan_media pins that hash.
    assert len({worker_revision(d.spec) for d in (base, limited, other)}) == 3
