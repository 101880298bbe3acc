"""`omni serve --session-kv-mb`: the conversation-KV budget reaches the engine options (1024 MiB
unless given; 0 turns it off); a bad value exits 2 naming the flag."""

from __future__ import annotations

import pytest

from omni_runtime.entrypoints.serve import build_parser, engine_options


@pytest.mark.parametrize(
    ("argv", "expected"), [([], 1024), (["--session-kv-mb", "0"], 0), (["--session-kv-mb", "64"], 64)]
)
def test_the_budget_reaches_the_engine_options(argv: list[str], expected: int) -> None:
    options = engine_options(build_parser().parse_args(argv), remote_stages={})
    assert options.session_kv_mb == expected


def test_a_negative_budget_exits_2_naming_the_flag(capsys) -> None:
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["--session-kv-mb", "-1"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "--session-kv-mb" in err and "must be 0 or more" in err
