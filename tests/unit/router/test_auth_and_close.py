"""Client API keys and WebSocket close codes: small pure rules with exact answers."""

from __future__ import annotations

import pytest

from omni_runtime.router.auth import ApiKeysError, authorized, load_api_keys
from omni_runtime.router.ws_relay import client_departure, sendable_close


def test_keys_file_skips_blanks_and_comments(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# router keys\nsk-one\n\n  sk-two  \n")
    assert load_api_keys(path) == (b"sk-one", b"sk-two")


def test_an_empty_keys_file_is_an_error(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# nothing yet\n")
    with pytest.raises(ApiKeysError) as caught:
        load_api_keys(path)
    assert str(caught.value) == f"--api-keys-file {path}: no keys in the file; write one key per line"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (b"Bearer sk-one", True),
        (b"bearer sk-two", True),
        (b"Bearer  sk-one ", True),
        (b"Bearer sk-on", False),
        (b"Bearer sk-one-more", False),
        (b"Basic sk-one", False),
        (b"sk-one", False),
        (b"", False),
        (None, False),
    ],
)
def test_bearer_keys(header, expected):
    assert authorized(header, (b"sk-one", b"sk-two")) is expected


@pytest.mark.parametrize(
    ("code", "reason", "expected"),
    [
        (1000, "done", (1000, "done")),
        (4001, "custom", (4001, "custom")),
        (1005, "", (1000, "")),  # closed without a status
        (None, "", (1000, "")),
        (1006, "", (1011, "lost")),  # abnormal closure cannot go on the wire
        (1015, "", (1011, "lost")),
        (2000, "", (1011, "lost")),
        (1000, "x" * 200, (1000, "x" * 123)),
    ],
)
def test_close_codes_that_may_go_on_the_wire(code, reason, expected):
    assert sendable_close(code, reason, fallback=(1011, "lost")) == expected


@pytest.mark.parametrize(
    ("code", "reason", "expected"),
    [
        (1000, "bye", (1000, "bye")),  # the client's own status goes on
        (4001, "custom", (4001, "custom")),
        (1005, "", (1001, "client went away")),  # no status: a drop (uvicorn's code for a lost socket)
        (None, "", (1001, "client went away")),
        (1006, "", (1001, "client went away")),
        (1015, "", (1001, "client went away")),
    ],
)
def test_a_client_that_leaves_without_a_status_is_going_away(code, reason, expected):
    assert client_departure(code, reason) == expected
