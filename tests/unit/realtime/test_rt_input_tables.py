"""Table tests of the pure input checks: voice names, lone surrogates, prompt caps, strict chunks."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from omni_runtime.contract.voices import OPENAI_VOICES, UnknownVoice, resolve_voice
from omni_runtime.realtime.request_types import lone_surrogate
from omni_runtime.realtime.settings import prompt_limits
from omni_runtime.realtime.streaming_input.models import Chunk

QWEN = ("Chelsie", "Ethan")
QWEN3 = ("Chelsie", "Ethan", "Aiden")


@pytest.mark.parametrize(
    ("requested", "voices", "default", "expected"),
    [
        (None, QWEN, "Chelsie", "Chelsie"),
        ("Ethan", QWEN, "Chelsie", "Ethan"),
        ("ethan", QWEN, "Chelsie", "Ethan"),
        ("alloy", QWEN, "Chelsie", "Chelsie"),
        ("Nova", QWEN, "Ethan", "Chelsie"),
        ("echo", QWEN, "Chelsie", "Ethan"),
        ("onyx", QWEN, "Chelsie", "Ethan"),
        ("aiden", QWEN3, "Ethan", "Aiden"),
        ("echo", QWEN3, "Ethan", "Ethan"),
        ("echo", ("Chelsie", "Aiden"), "Chelsie", "Aiden"),  # Qwen3's other male speaker
        ("echo", ("Anna",), "Anna", "Anna"),  # no speaker of that style: the default
        ("echo", ("Anna", "Bob"), None, "Anna"),
        ("alloy", (), None, None),  # voices unknown here: OpenAI names mean the default
        ("Someone", (), None, "Someone"),  # ... and others pass through to the talker
    ],
)
def test_resolve_voice(
    requested: str | None, voices: tuple[str, ...], default: str | None, expected: str | None
) -> None:
    assert resolve_voice(requested, voices=voices, default=default) == expected


def test_every_openai_voice_maps_to_a_qwen_speaker_and_unknown_ones_list_the_voices() -> None:
    mapped = {name: resolve_voice(name, voices=QWEN, default="Chelsie") for name in OPENAI_VOICES}
    assert sorted(name for name, voice in mapped.items() if voice == "Chelsie") == [
        "alloy", "coral", "marin", "nova", "sage", "shimmer",
    ]  # fmt: skip
    assert sorted(name for name, voice in mapped.items() if voice == "Ethan") == [
        "ash", "ballad", "cedar", "echo", "fable", "onyx", "verse",
    ]  # fmt: skip
    with pytest.raises(UnknownVoice, match=r"^unknown voice 'Nobody'; available: Chelsie, Ethan$"):
        resolve_voice("Nobody", voices=QWEN, default="Chelsie")


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("", False),
        ("plain", False),
        ("héllo 😀", False),
        ("\ud800", True),
        ("a\udfffb", True),
        ("😀\ud83d", True),
    ],
)
def test_lone_surrogate(text: str, bad: bool) -> None:
    assert lone_surrogate(text) is bad


@pytest.mark.parametrize(
    ("context", "chars", "messages", "expected"),
    [
        (512, None, None, (16_384, 128)),
        (32_768, None, None, (1_048_576, 8192)),
        (2, None, None, (64, 1)),
        (512, 10, 3, (10, 3)),
    ],
)
def test_prompt_limits(
    context: int, chars: int | None, messages: int | None, expected: tuple[int, int]
) -> None:
    assert prompt_limits(context, max_chars=chars, max_messages=messages) == expected


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"sequence_id": "1", "modality": "text", "text": "x"}, "sequence_id"),
        ({"sequence_id": 1.0, "modality": "text", "text": "x"}, "sequence_id"),
        ({"sequence_id": True, "modality": "text", "text": "x"}, "sequence_id"),
        ({"sequence_id": 1, "modality": "text", "text": "x", "end_of_input": "true"}, "end_of_input"),
        ({"sequence_id": 1, "modality": "text", "text": "x", "payload": "eA=="}, ""),
        ({"sequence_id": 1, "modality": "text", "text": "\ud800"}, "text"),
    ],
)
def test_chunks_are_strict(body: dict, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Chunk.model_validate(body)
    assert ".".join(str(p) for p in caught.value.errors()[0]["loc"]) == field
