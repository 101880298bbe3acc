"""The admin API's own credential, the loopback rule, head and session-key limits, clipped log
fields: pure rules with exact answers, and the order the router applies them in (`_refusal`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from omni_runtime.router import logs
from omni_runtime.router.app import RouterApp
from omni_runtime.router.auth import admin_refusal, is_admin_path, is_loopback
from omni_runtime.router.binding import session_id_in
from omni_runtime.router.context import RouterConfig
from omni_runtime.router.main import build_parser

ADMIN = (b"adm-1",)
CLIENT = (b"sk-1",)


@pytest.mark.parametrize(
    ("client", "expected"),
    [
        (("127.0.0.1", 5000), True),
        (("127.9.8.7", 5000), True),
        (("::1", 5000), True),
        (("::ffff:127.0.0.1", 5000), True),
        (("10.0.0.7", 5000), False),
        (("::ffff:10.0.0.7", 5000), False),
        (("192.168.1.2", 5000), False),
        (("fe80::1", 5000), False),
        (("not-an-address", 5000), False),
        (None, True),  # a Unix socket: no peer address
    ],
)
def test_is_loopback(client, expected):
    assert is_loopback(client) is expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [("/admin/workers", True), ("/admin/workers/w0/drain", True), ("/admin", True), ("/administer", False),
     ("/v1/admin/workers", False), ("/health", False)],
)  # fmt: skip
def test_is_admin_path(path, expected):
    assert is_admin_path(path) is expected


REMOTE = ("10.0.0.7", 5000)
LOCAL = ("127.0.0.1", 5000)


@pytest.mark.parametrize(
    ("client", "authorization", "admin_keys", "api_keys", "expected"),
    [
        # No admin keys: loopback only, whatever is sent; client keys open nothing.
        (LOCAL, None, (), (), None),
        (LOCAL, None, (), CLIENT, None),
        (REMOTE, None, (), (), (403, "admin_forbidden")),
        (REMOTE, b"Bearer sk-1", (), CLIENT, (403, "admin_forbidden")),
        (REMOTE, b"Bearer adm-1", (), CLIENT, (403, "admin_forbidden")),
        # Admin keys: the admin key from anywhere, loopback included; nothing else.
        (REMOTE, b"Bearer adm-1", ADMIN, CLIENT, None),
        (LOCAL, b"Bearer adm-1", ADMIN, (), None),
        (LOCAL, None, ADMIN, (), (401, "invalid_admin_key")),
        (REMOTE, None, ADMIN, CLIENT, (401, "invalid_admin_key")),
        (REMOTE, b"Bearer adm-2", ADMIN, CLIENT, (401, "invalid_admin_key")),
        (REMOTE, b"Bearer sk-1", ADMIN, CLIENT, (403, "admin_forbidden")),
        (LOCAL, b"Bearer sk-1", ADMIN, CLIENT, (403, "admin_forbidden")),
        (REMOTE, b"Bearer sk-1", ADMIN, (), (401, "invalid_admin_key")),
    ],
)
def test_admin_refusal(client, authorization, admin_keys, api_keys, expected):
    refusal = admin_refusal(
        client=client, authorization=authorization, admin_keys=admin_keys, api_keys=api_keys
    )
    assert (None if refusal is None else (refusal.status, refusal.code)) == expected


def _app(**config: Any) -> RouterApp:
    return RouterApp(config=RouterConfig(**config), source=None)  # type: ignore[arg-type]


def _scope(
    path: str, *headers: tuple[bytes, bytes], client=LOCAL, kind: str = "http", query: bytes = b""
) -> dict[str, Any]:
    return {
        "type": kind,
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "headers": list(headers),
        "client": client,
    }


BIG = b"a" * (1 << 20)


@pytest.mark.parametrize(
    ("scope", "config", "expected"),
    [
        (_scope("/v1/models"), {}, None),
        (_scope("/v1/models", (b"x-session-id", BIG)), {}, (431, "request_headers_too_large")),
        (_scope("/health", (b"x-other", BIG)), {}, (431, "request_headers_too_large")),
        (_scope("/admin/workers", (b"x-other", BIG)), {}, (431, "request_headers_too_large")),
        (_scope("/v1/models", (b"x-session-id", b"k" * 256)), {}, None),
        (_scope("/v1/models", (b"x-session-id", b"k" * 257)), {}, (431, "session_key_too_long")),
        (_scope("/v1/models", (b"x-conv", b"k" * 257)), {"session_header": "X-Conv"}, (431, "session_key_too_long")),
        (_scope("/v1/models", (b"x-session-id", b"k" * 300)), {"max_session_key_bytes": 300}, None),
        (_scope("/v1/models", (b"x-a", b"a" * 900)), {"max_header_bytes": 1000}, None),
        (_scope("/v1/models", (b"x-a", b"a" * 1000)), {"max_header_bytes": 1000}, (431, "request_headers_too_large")),
        (_scope("/v1/models", query=b"q=" + b"a" * 1000), {"max_header_bytes": 1000}, (431, "request_headers_too_large")),
        (_scope("/ws", (b"x-session-id", BIG), kind="websocket"), {}, (431, "request_headers_too_large")),
        # Client keys: the proxied API and WebSockets need one; probes do not; admin ignores them.
        (_scope("/v1/models"), {"api_keys": CLIENT}, (401, "invalid_api_key")),
        (_scope("/v1/models", (b"authorization", b"Bearer sk-1")), {"api_keys": CLIENT}, None),
        (_scope("/health"), {"api_keys": CLIENT}, None),
        (_scope("/health", kind="websocket"), {"api_keys": CLIENT}, (401, "invalid_api_key")),
        (_scope("/admin/workers"), {"api_keys": CLIENT}, None),
        (_scope("/admin/workers", client=REMOTE), {"api_keys": CLIENT}, (403, "admin_forbidden")),
        (
            _scope("/admin/workers/w0/drain", (b"authorization", b"Bearer sk-1"), client=REMOTE),
            {"api_keys": CLIENT},
            (403, "admin_forbidden"),
        ),
        (
            _scope("/admin/workers/w0/drain", (b"authorization", b"Bearer sk-1")),
            {"api_keys": CLIENT, "admin_keys": ADMIN},
            (403, "admin_forbidden"),
        ),
        (
            _scope("/admin/workers", (b"authorization", b"Bearer adm-1"), client=REMOTE),
            {"api_keys": CLIENT, "admin_keys": ADMIN},
            None,
        ),
        # The admin key is not a client key.
        (
            _scope("/v1/models", (b"authorization", b"Bearer adm-1")),
            {"api_keys": CLIENT, "admin_keys": ADMIN},
            (401, "invalid_api_key"),
        ),
    ],
)  # fmt: skip
def test_what_the_router_refuses_before_routing(scope, config, expected):
    refusal = _app(**config)._refusal(scope)
    assert (None if refusal is None else (refusal.status, refusal.code)) == expected


def test_the_431_answers_are_openai_error_json():
    refusal = _app()._refusal(_scope("/v1/chat/completions", (b"x-session-id", b"k" * 257)))
    assert refusal is not None
    assert json.loads(refusal.body()) == {
        "error": {
            "message": "The X-Session-Id header is longer than 256 bytes; use a shorter session key.",
            "type": "invalid_request_error",
            "param": None,
            "code": "session_key_too_long",
        }
    }


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("short", 8, "short"),
        ("12345678", 8, "12345678"),
        ("123456789", 8, "12345678...[1 more chars]"),
        ("x" * 1000, 4, "xxxx...[996 more chars]"),
        ("", 0, ""),
    ],
)
def test_clip(text, limit, expected):
    assert logs.clip(text, limit) == expected


def test_clip_fields_cuts_long_strings_only():
    fields = {"session": "s" * 600, "status": 200, "workers": ["w0"], "path": "/v1"}
    assert logs.clip_fields(fields) == {
        "session": "s" * 512 + "...[88 more chars]",
        "status": 200,
        "workers": ["w0"],
        "path": "/v1",
    }
    short = {"session": "abc"}
    assert logs.clip_fields(short) is short  # the hot path allocates nothing


@pytest.mark.parametrize(
    ("header", "query", "path", "expected"),
    [
        ("sess_w0.abcdefgh", {}, "/x", ("sess_w0.abcdefgh", "w0")),
        ("sess_w0." + "a" * 248, {}, "/x", ("sess_w0." + "a" * 248, "w0")),
        ("sess_w0." + "a" * 249, {}, "/x", None),  # 257 characters: not one of ours
        (None, {"session_id": "sess_w1." + "b" * 300}, "/x", None),
        (None, {}, "/v1/s/sess_w1." + "b" * 300, None),
        ("sess_w0." + "a" * 249, {"session_id": "sess_w1.bbbbbbbb"}, "/x", ("sess_w1.bbbbbbbb", "w1")),
    ],
)
def test_overlong_session_ids_are_not_session_ids(header, query, path, expected):
    assert session_id_in(path=path, query=query, header_value=header) == expected


def test_router_defaults_to_loopback_and_limits():
    args = build_parser().parse_args(["--workers-file", "w.json"])
    assert (args.host, args.max_header_bytes, args.admin_keys_file) == ("127.0.0.1", 65536, None)
