"""spec.streamingInput in the plan: `omni serve` flags on the worker API process only, none (and the
same revision) when left unset, refusals naming the field; the flags parse back to the settings."""

from __future__ import annotations

import pydantic
import pytest
from spec_builders import deployment

from omni_operator.plan import plan_deployment, worker_revision
from omni_operator.plan.types import Role
from omni_runtime.entrypoints.serve import build_parser
from omni_runtime.entrypoints.streaming_input_flags import realtime_settings
from omni_runtime.media.limits import MediaLimits


def _flags(command: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for i, part in enumerate(command):
        if "streaming-input" in part or (i and "streaming-input-" in command[i - 1]):
            out.append(part)
    return out


@pytest.mark.parametrize(
    ("settings", "flags"),
    [
        ({}, []),
        ({"streamingInput.enabled": False}, ["--no-streaming-input"]),
        ({"streamingInput.sessionTimeoutSec": 30}, ["--streaming-input-session-timeout-sec", "30"]),
        ({"streamingInput.sessionTimeoutSec": 2.5}, ["--streaming-input-session-timeout-sec", "2.5"]),
        (
            {"streamingInput.maxPayloadPerSession": 1048576},
            ["--streaming-input-max-payload-per-session", "1048576"],
        ),
        (
            {"streamingInput.startPolicy": "on_first_chunk"},
            ["--streaming-input-start-policy", "on_first_chunk"],
        ),
        (
            {"streamingInput.startPolicy": "on_min_length", "streamingInput.minLengthBytes": 4096},
            ["--streaming-input-start-policy", "on_min_length", "--streaming-input-min-length", "4096"],
        ),
        ({"streamingInput.maxSessions": 8}, ["--streaming-input-max-sessions", "8"]),
        (  # the bound: the runtime's flag takes it
            {"streamingInput.minLengthBytes": 2**34},
            ["--streaming-input-min-length", "17179869184"],
        ),
    ],
)
def test_streaming_input_renders_serve_flags_on_the_api_pod_only(settings: dict, flags: list[str]) -> None:
    plan = plan_deployment(deployment(**{"model.name": "Qwen2.5-Omni-7B", **settings}))
    pods = {p.role: p for p in plan.workers[0].pods}
    assert pods[Role.api].container.command[:2] == ("omni", "serve")
    assert _flags(pods[Role.api].container.command) == flags
    for role in (Role.thinker, Role.talker):  # `omni stage` holds no sessions
        assert _flags(pods[role].container.command) == []
    # The rendered flags are ones `omni serve` takes, and they give the settings asked for.
    args = build_parser().parse_args(flags)
    rendered = realtime_settings(args, limits=MediaLimits())
    for key, value in settings.items():
        assert getattr(rendered, SETTING[key]) == value


SETTING = {
    "streamingInput.enabled": "streaming_input_enabled",
    "streamingInput.sessionTimeoutSec": "session_timeout_s",
    "streamingInput.maxPayloadPerSession": "max_payload_per_session",
    "streamingInput.startPolicy": "start_policy",
    "streamingInput.minLengthBytes": "min_length_bytes",
    "streamingInput.maxSessions": "max_streaming_input_sessions",
}


def test_worker_revision_moves_only_when_streaming_input_is_set() -> None:
    base = deployment(**{"model.name": "Qwen2.5-Omni-7B"})
    assert worker_revision(
        deployment(**{"model.name": "Qwen2.5-Omni-7B", "streamingInput.enabled": True}).spec
    ) == (worker_revision(base.spec))
    changed = deployment(**{"model.name": "Qwen2.5-Omni-7B", "streamingInput.startPolicy": "on_first_chunk"})
    assert worker_revision(changed.spec) != worker_revision(base.spec)


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        ({"streamingInput.startPolicy": "eventually"}, "Input should be 'on_end_only', 'on_first_chunk'"),
        ({"streamingInput.sessionTimeoutSec": 0}, "greater than 0"),
        ({"streamingInput.maxPayloadPerSession": 0}, "greater than or equal to 1"),
        ({"streamingInput.minLengthBytes": 0}, "greater than or equal to 1"),
        ({"streamingInput.minLengthBytes": 2**34 + 1}, "less than or equal to 17179869184"),
        ({"streamingInput.sessionTimeout": 30}, "Extra inputs are not permitted"),
    ],
)
def test_bad_streaming_input_settings_are_refused(settings: dict[str, object], fragment: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="streamingInput") as caught:
        deployment(**settings)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--streaming-input-start-policy", "later"], "invalid choice: 'later'"),
        (["--streaming-input-session-timeout-sec", "0"], "must be a finite number above 0"),
        (["--streaming-input-session-timeout-sec", "inf"], "must be a finite number above 0"),
        (["--streaming-input-max-payload-per-session", "-1"], "must be at least 1"),
        (["--encoder-cache-mb", "-1"], "must be 0 or more"),
    ],
)
def test_bad_serve_flags_exit_2_naming_the_flag(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert argv[0] in err and message in err
