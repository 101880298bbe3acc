"""A prompt without media takes the tokenizer alone (models.common.text_only_ids): the ids are the
processor's own, for each family's real processor; a text that spells a media placeholder is
refused with a 400 naming ``messages``."""

from __future__ import annotations

import re

import pytest
from engine_harness import Harness

from omni_runtime.contract.engine import ChatTurn, EngineError, GenerationRequest, SamplingParams
from omni_runtime.models.common import collect_messages

TEXTS = [
    "Hello there",
    "plain text ünïcödé 你好 🙂  spaces   and\ttabs\n\n",
    "",
    "a longer question, " * 40,
]


def _processor_ids(harness: Harness, req: GenerationRequest, system: str | None) -> list[int]:
    """The processor's path, as the adapters took it for every prompt before."""
    proc = harness.engine.adapter.loaded.processor
    messages = collect_messages(req, default_system=system).messages
    text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return proc(text=[text], return_tensors="pt")["input_ids"][0].tolist()


def _system(harness: Harness) -> str | None:
    from omni_runtime.models.qwen2_5_omni.adapter import DEFAULT_SYSTEM_PROMPT, Qwen25OmniAdapter

    return DEFAULT_SYSTEM_PROMPT if isinstance(harness.engine.adapter, Qwen25OmniAdapter) else None


@pytest.mark.parametrize("text", TEXTS)
def test_a_text_only_prompt_has_the_processors_ids(family_speech_engine: Harness, text: str) -> None:
    turns = (
        ChatTurn(role="system", text="Be brief."),
        ChatTurn(role="user", text="Before"),
        ChatTurn(role="assistant", text="Noted."),
        ChatTurn(role="user", text=text),
    )
    for req in (
        GenerationRequest(request_id="one", turns=(ChatTurn(role="user", text=text),)),
        GenerationRequest(request_id="turns", turns=turns),
    ):
        ours = family_speech_engine.engine.adapter.preprocess(req).input_ids
        assert ours == _processor_ids(family_speech_engine, req, _system(family_speech_engine))
        assert ours  # the chat template's tokens at least


@pytest.mark.parametrize("which", ["audio_token", "image_token", "video_token"])
def test_a_text_naming_a_placeholder_is_refused_with_a_400(family_speech_engine: Harness, which: str) -> None:
    """Before, the processor raised a ValueError for it: the request failed with a traceback."""
    adapter = family_speech_engine.engine.adapter
    token = adapter.tokenizer.convert_ids_to_tokens(getattr(adapter, which))
    req = GenerationRequest(request_id="r", turns=(ChatTurn(role="user", text=f"say {token} now"),))
    with pytest.raises(EngineError, match=f"a user message's text contains {re.escape(token)}") as caught:
        adapter.preprocess(req)
    assert (caught.value.status, caught.value.param) == (400, "messages")
    served = GenerationRequest(request_id="r", turns=req.turns, sampling=SamplingParams(max_tokens=4))
    with pytest.raises(EngineError, match="reserves for media") as through:  # the engine's own path
        family_speech_engine.collect(served)
    assert (through.value.status, through.value.param) == (400, "messages")
