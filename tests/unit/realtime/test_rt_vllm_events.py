"""vLLM's transcription dialect, pure parts: which dialect a socket speaks, and its client events."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from omni_runtime.realtime.errors import ProtocolError
from omni_runtime.realtime.transcription.dialect import pick_dialect, requested_dialect
from omni_runtime.realtime.transcription.events import (
    TranscriptionConfig,
    apply_session_update,
    parse_append,
    parse_commit,
    parse_event,
)


@pytest.mark.parametrize(
    ("value", "duplex", "expected"),
    [
        (None, False, None),
        ("", False, None),
        ("auto", False, None),
        ("openai", False, "openai"),
        ("vllm", False, "vllm"),
        (None, True, "openai"),
        ("auto", True, "openai"),
        ("openai", True, "openai"),
    ],
)
def test_requested_dialect(value, duplex, expected) -> None:
    assert requested_dialect(value, duplex=duplex) == expected


@pytest.mark.parametrize(
    ("value", "duplex", "says"), [("vllm", True, "duplex"), ("grpc", False, "unknown protocol")]
)
def test_requested_dialect_refusals_name_the_parameter(value, duplex, says) -> None:
    with pytest.raises(ProtocolError) as caught:
        requested_dialect(value, duplex=duplex)
    assert (caught.value.code, caught.value.param) == ("invalid_value", "protocol")
    assert says in caught.value.message


@pytest.mark.parametrize(
    ("first", "expected"),
    [
        ({"type": "session.update", "model": "m"}, "vllm"),
        ({"type": "session.update"}, "vllm"),
        ({"type": "input_audio_buffer.commit"}, "vllm"),
        ({"type": "input_audio_buffer.commit", "final": True}, "vllm"),
        ({"type": "session.update", "session": {"type": "realtime"}}, "openai"),
        ({"type": "input_audio_buffer.append", "audio": ""}, "openai"),
        ({"type": "response.create"}, "openai"),
        ({"type": "conversation.item.create", "item": {}}, "openai"),
        ({"model": "m"}, "openai"),
        ([{"type": "session.update", "model": "m"}], "openai"),
        ("not json", "openai"),
    ],
)
def test_pick_dialect_from_the_first_event(first, expected) -> None:
    text = first if isinstance(first, str) else json.dumps(first)
    assert pick_dialect(text, max_bytes=1000) == expected


def test_pick_dialect_does_not_parse_an_oversize_event() -> None:
    text = json.dumps({"type": "session.update", "model": "m" * 100})
    assert pick_dialect(text, max_bytes=50) == "openai"


BASE = TranscriptionConfig(model="tiny", max_tokens=64)


def update(**fields):
    return apply_session_update(
        BASE,
        {"type": "session.update", **fields},
        served_model="tiny",
        audio_out=True,
        max_prompt_chars=100,
        max_model_len=512,
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"model": "tiny"}, BASE),
        ({"model": "tiny", "extra": 1, "language": "en"}, BASE),  # other fields are ignored, as vLLM does
        (
            {"model": "tiny", "modalities": ["text", "audio"]},
            TranscriptionConfig("tiny", 64, want_audio=True),
        ),
        ({"model": "tiny", "modalities": ["text"]}, BASE),
        (
            {"model": "tiny", "instructions": "Be brief."},
            TranscriptionConfig("tiny", 64, instructions="Be brief."),
        ),
        ({"model": "tiny", "max_tokens": 512}, TranscriptionConfig("tiny", 512)),
        ({"model": "tiny", "temperature": 1}, TranscriptionConfig("tiny", 64, temperature=1.0)),
        ({"model": "tiny", "voice": "Ethan"}, TranscriptionConfig("tiny", 64, voice="Ethan")),
        ({"model": "tiny", "voice": None}, BASE),
    ],
)
def test_session_update_fields(fields, expected) -> None:
    assert update(**fields) == expected


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({}, "missing_required_parameter", "model"),
        ({"model": None}, "invalid_value", "model"),
        ({"model": 7}, "invalid_value", "model"),
        ({"model": "other"}, "model_not_found", "model"),
        ({"model": "tiny", "modalities": "audio"}, "invalid_value", "modalities"),
        ({"model": "tiny", "modalities": []}, "invalid_value", "modalities"),
        ({"model": "tiny", "modalities": ["audio"]}, "invalid_value", "modalities"),
        ({"model": "tiny", "modalities": ["text", "video"]}, "invalid_value", "modalities"),
        ({"model": "tiny", "instructions": 3}, "invalid_value", "instructions"),
        ({"model": "tiny", "instructions": "x" * 101}, "prompt_too_long", "instructions"),
        ({"model": "tiny", "max_tokens": 0}, "invalid_value", "max_tokens"),
        ({"model": "tiny", "max_tokens": 513}, "invalid_value", "max_tokens"),
        ({"model": "tiny", "max_tokens": True}, "invalid_value", "max_tokens"),
        ({"model": "tiny", "max_tokens": "5"}, "invalid_value", "max_tokens"),
        ({"model": "tiny", "temperature": -0.1}, "invalid_value", "temperature"),
        ({"model": "tiny", "temperature": "hot"}, "invalid_value", "temperature"),
        ({"model": "tiny", "temperature": False}, "invalid_value", "temperature"),
        ({"model": "tiny", "voice": 5}, "invalid_value", "voice"),
    ],
)
def test_session_update_refusals_name_the_field(fields, code, param) -> None:
    with pytest.raises(ProtocolError) as caught:
        update(**fields)
    assert (caught.value.code, caught.value.param) == (code, param)


def test_session_update_without_speech_output_refuses_audio() -> None:
    with pytest.raises(ProtocolError) as caught:
        apply_session_update(
            BASE,
            {"model": "tiny", "modalities": ["text", "audio"]},
            served_model="tiny",
            audio_out=False,
            max_prompt_chars=100,
            max_model_len=512,
        )
    assert caught.value.param == "modalities" and "no speech output" in caught.value.message


def b64(samples: list[int]) -> str:
    return base64.b64encode(np.array(samples, dtype="<i2").tobytes()).decode()


def test_append_decodes_pcm16() -> None:
    pcm = parse_append({"audio": b64([0, 16384, -32768])}, max_bytes=100)
    assert pcm.tolist() == [0.0, 0.5, -1.0]


@pytest.mark.parametrize(
    ("event", "code"),
    [
        ({}, "missing_required_parameter"),
        ({"audio": None}, "invalid_base64"),
        ({"audio": 12}, "invalid_base64"),
        ({"audio": "@@@@"}, "invalid_base64"),
        ({"audio": ""}, "invalid_audio"),
        ({"audio": base64.b64encode(b"abc").decode()}, "invalid_audio"),
        ({"audio": b64([1] * 100)}, "event_too_large"),
    ],
)
def test_append_refusals(event, code) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_append(event, max_bytes=100)
    assert (caught.value.code, caught.value.param) == (code, "audio")


@pytest.mark.parametrize(
    ("event", "final"), [({}, False), ({"final": False}, False), ({"final": True}, True)]
)
def test_commit_final(event, final) -> None:
    assert parse_commit(event) is final


@pytest.mark.parametrize("value", ["true", 1, 0, None, [], {}])
def test_commit_final_must_be_a_boolean(value) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_commit({"final": value})
    assert (caught.value.code, caught.value.param) == ("invalid_value", "final")


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("{", "invalid_json"),
        ("[]", "invalid_event"),
        ('{"type": 3}', "invalid_event"),
        ('{"model": "tiny"}', "invalid_event"),
        ('{"type": "response.create"}', "unknown_event_type"),
        ('{"type": "input_audio_buffer.clear"}', "unknown_event_type"),
        ('{"type": "session.update", "model": "' + "m" * 100 + '"}', "event_too_large"),
    ],
)
def test_event_refusals(text, code) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_event(text, max_bytes=100)
    assert caught.value.code == code


def test_event_types() -> None:
    for kind in ("session.update", "input_audio_buffer.append", "input_audio_buffer.commit"):
        assert parse_event(json.dumps({"type": kind}), max_bytes=100) == {"type": kind}
