"""Table tests of the pure duplex decisions: event names per dialect, listen/speak, force counts, history per ack."""

from __future__ import annotations

import json

import pytest

from omni_runtime.realtime.errors import ProtocolError
from omni_runtime.realtime.outbox import Outbox, event_renames
from omni_runtime.realtime.session.conversation import trim_to_played
from omni_runtime.realtime.session.duplex_config import DuplexConfig, event_dialect, parse_duplex
from omni_runtime.realtime.session.duplex_policy import (
    Decision,
    UnitState,
    decide_unit,
    model_choice,
    played_for_history,
)

# --- event naming per mode -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("native", "beta_header", "query", "dialect"),
    [
        (False, False, None, "ga"),  # /v1/realtime and /v1/realtime?duplex=1 (released vLLM-Omni names)
        (False, True, None, "beta"),  # OpenAI-Beta: realtime=v1
        (True, False, None, "duplex"),  # /v1/duplex
        (True, True, None, "duplex"),  # the native socket ignores the OpenAI beta header
        (False, False, "duplex", "duplex"),
        (True, False, "ga", "ga"),
        (False, True, "ga", "ga"),
        (False, False, "", "ga"),
    ],
)
def test_event_dialect(native: bool, beta_header: bool, query: str | None, dialect: str) -> None:
    assert event_dialect(native=native, beta_header=beta_header, query=query) == dialect


def test_event_dialect_refuses_unknown_names() -> None:
    with pytest.raises(ProtocolError) as err:
        event_dialect(native=True, beta_header=False, query="v2")
    assert err.value.param == "event_names" and "ga, beta, duplex" in err.value.message


@pytest.mark.parametrize(
    ("ga_name", "ga", "beta", "duplex"),
    [
        (
            "response.output_audio.delta",
            "response.output_audio.delta",
            "response.audio.delta",
            "response.audio.delta",
        ),
        (
            "response.output_audio.done",
            "response.output_audio.done",
            "response.audio.done",
            "response.audio.done",
        ),
        (
            "response.output_audio_transcript.delta",
            "response.output_audio_transcript.delta",
            "response.audio_transcript.delta",
            "response.audio_transcript.delta",
        ),
        (
            "response.output_audio_transcript.done",
            "response.output_audio_transcript.done",
            "response.audio_transcript.done",
            "response.audio_transcript.done",
        ),
        (
            "response.output_text.delta",
            "response.output_text.delta",
            "response.text.delta",
            "response.output_text.delta",
        ),
        (
            "conversation.item.added",
            "conversation.item.added",
            "conversation.item.created",
            "conversation.item.added",
        ),
        ("response.listen", "response.listen", "response.listen", "response.listen"),
        ("response.done", "response.done", "response.done", "response.done"),
    ],
)
def test_event_names_per_dialect(ga_name: str, ga: str, beta: str, duplex: str) -> None:
    for renames, want in (
        (event_renames(beta=False, duplex_names=False), ga),
        (event_renames(beta=True, duplex_names=False), beta),
        (event_renames(beta=False, duplex_names=True), duplex),
    ):
        assert renames.get(ga_name, ga_name) == want


def test_duplex_outbox_sends_the_renamed_pair_and_keeps_items_ga() -> None:
    box = Outbox(beta=False, keep_log=False, max_log_events=0, max_log_bytes=0, duplex_names=True)
    box.emit("response.output_audio.delta", epoch=0, delta="AAAA")
    box.emit("response.output_audio_transcript.delta", epoch=0, delta="")
    box.emit("conversation.item.done", item={"content": [{"type": "output_audio"}]})
    sent = [json.loads(text) for text in box.ready_texts()]
    assert [e["type"] for e in sent] == [
        "response.audio.delta",
        "response.audio_transcript.delta",
        "conversation.item.done",
    ]
    assert sent[2]["item"]["content"][0]["type"] == "output_audio"  # not the beta part name


# --- listen / speak ---------------------------------------------------------------------------


def unit(**overrides: object) -> UnitState:
    base = dict(
        index=5,
        force_listen_count=0,
        client_force_listen=False,
        user_speaking=False,
        new_input=True,
        response_active=False,
    )
    return UnitState(**{**base, **overrides})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "decision"),
    [
        (unit(response_active=True), Decision("none", "speaking")),
        (unit(response_active=True, index=0, force_listen_count=3), Decision("none", "speaking")),
        (unit(index=0, force_listen_count=3), Decision("listen", "force_listen_count")),
        (unit(index=2, force_listen_count=3), Decision("listen", "force_listen_count")),
        (unit(index=3, force_listen_count=3), Decision("speak", "model_speak", ask_model=True)),
        (unit(index=0, force_listen_count=0), Decision("speak", "model_speak", ask_model=True)),
        (unit(client_force_listen=True), Decision("listen", "client_force_listen")),
        (
            unit(index=1, force_listen_count=2, client_force_listen=True),
            Decision("listen", "force_listen_count"),
        ),
        (unit(user_speaking=True), Decision("listen", "user_speaking")),
        (unit(user_speaking=True, client_force_listen=True), Decision("listen", "client_force_listen")),
        (unit(new_input=False), Decision("listen", "no_new_input")),
        (unit(new_input=False, user_speaking=True), Decision("listen", "user_speaking")),
    ],
)
def test_decide_unit(state: UnitState, decision: Decision) -> None:
    assert decide_unit(state) == decision


@pytest.mark.parametrize(
    ("text", "finish", "action", "model_listen"),
    [
        ("", "stop", "listen", True),  # end of turn at once: nothing to say
        ("", "length", "listen", True),  # a special token that decodes to nothing
        ("  ", "length", "listen", True),
        ("<|listen|>", "length", "listen", True),
        ("<listen>", "length", "listen", True),
        ("...", "length", "listen", True),
        ("Sure", "length", "speak", False),
        (" The", "length", "speak", False),
        ("Hi", "stop", "speak", False),
    ],
)
def test_model_choice(text: str, finish: str, action: str, model_listen: bool) -> None:
    decision = model_choice(text=text, finish_reason=finish)
    assert (decision.action, decision.model_listen) == (action, model_listen)


def test_force_listen_count_over_a_session() -> None:
    """The first N units listen whatever else holds; from unit N the model is asked."""
    actions = [decide_unit(unit(index=i, force_listen_count=3)).action for i in range(6)]
    assert actions == ["listen", "listen", "listen", "speak", "speak", "speak"]


# --- history per ack --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("acked", "client_acks", "estimate", "total", "played"),
    [
        (800, True, 2000, 3000, 800),  # the ack wins over the clock
        (None, True, 2000, 3000, 0),  # an acking client that has not acked this item heard none of it
        (None, False, 2000, 3000, 2000),  # a client that never acks: real-time estimate
        (5000, True, 0, 3000, 3000),  # clipped to the audio there is
        (None, False, 9000, 3000, 3000),
        (0, True, 3000, 3000, 0),
    ],
)
def test_played_for_history(
    acked: int | None, client_acks: bool, estimate: int, total: int, played: int
) -> None:
    assert (
        played_for_history(acked_ms=acked, client_acks=client_acks, estimate_ms=estimate, total_ms=total)
        == played
    )


@pytest.mark.parametrize(
    ("played", "kept"),
    [
        (None, "one two three four"),
        (0, ""),
        (1000, "one"),
        (2000, "one two"),
        (3999, "one two three"),
        (4000, "one two three four"),
    ],
)
def test_history_text_per_ack(played: int | None, kept: str) -> None:
    assert trim_to_played("one two three four", played_ms=played, total_ms=4000) == kept


# --- session fields ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("session", "want"),
    [
        ({}, DuplexConfig()),
        (
            {"extra_body": {"auto_response": True, "force_listen_count": 2}},
            DuplexConfig(auto_response=True, force_listen_count=2),
        ),
        ({"full_duplex": True}, DuplexConfig(full_duplex=True)),
        (
            {"duplex": {"backchannel_max_ms": 0, "unit_ms": 500}},
            DuplexConfig(backchannel_max_ms=0, unit_ms=500),
        ),
        (
            {
                "force_listen_count": 1,
                "extra_body": {"force_listen_count": 2},
                "duplex": {"force_listen_count": 3},
            },
            DuplexConfig(force_listen_count=3),
        ),
        ({"backchannel_max_ms": 0}, DuplexConfig()),  # top-level backchannel is not a duplex field
    ],
)
def test_parse_duplex(session: dict, want: DuplexConfig) -> None:
    assert parse_duplex(session, DuplexConfig()) == want
    assert want.model_driven == (want.auto_response or want.full_duplex)


@pytest.mark.parametrize(
    ("session", "param"),
    [
        ({"auto_response": "yes"}, "session.auto_response"),
        ({"extra_body": {"force_listen_count": -1}}, "session.extra_body.force_listen_count"),
        ({"extra_body": {"force_listen_count": True}}, "session.extra_body.force_listen_count"),
        ({"duplex": {"unit_ms": 10}}, "session.duplex.unit_ms"),
        ({"extra_body": "auto"}, "session.extra_body"),
        ({"duplex": []}, "session.duplex"),
    ],
)
def test_parse_duplex_names_the_bad_field(session: dict, param: str) -> None:
    with pytest.raises(ProtocolError) as err:
        parse_duplex(session, DuplexConfig())
    assert err.value.param == param
