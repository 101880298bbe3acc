"""Incremental detokenization never emits half characters; stop strings are cut exactly."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from omni_runtime.pipeline.detokenize import IncrementalDetokenizer, StopMatcher


@pytest.fixture(scope="module")
def byte_bpe() -> Tokenizer:
    """A byte-level BPE trained on ASCII only: every non-ASCII character is split into byte tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(["hello world, the quick brown fox"] * 50, trainer=trainer)
    tok.add_special_tokens(["<|im_end|>"])
    return tok


def test_multibyte_characters_are_held_until_complete(byte_bpe: Tokenizer) -> None:
    text = "héllo 😀 wörld"
    ids = byte_bpe.encode(text).ids
    assert len(ids) > len(text.split()), "non-ASCII characters must span several tokens here"
    detok = IncrementalDetokenizer(byte_bpe)
    deltas = [detok.push(i) for i in ids]
    deltas.append(detok.flush())
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    emoji_bytes = len("😀".encode())
    assert deltas.count("") >= emoji_bytes - 1  # the emoji's first three byte tokens emit nothing


def test_special_tokens_are_skipped(byte_bpe: Tokenizer) -> None:
    end = byte_bpe.token_to_id("<|im_end|>")
    detok = IncrementalDetokenizer(byte_bpe)
    out = "".join(detok.push(i) for i in [*byte_bpe.encode("hello").ids, end]) + detok.flush()
    assert out == "hello"


def test_a_truncated_character_is_flushed_as_a_replacement_char(byte_bpe: Tokenizer) -> None:
    ids = byte_bpe.encode("ok😀").ids
    detok = IncrementalDetokenizer(byte_bpe)
    emitted = "".join(detok.push(i) for i in ids[:-1])
    assert emitted == "ok"
    assert detok.flush() == "\ufffd"


def test_stop_matcher_cuts_before_the_stop_string_across_deltas() -> None:
    stops = StopMatcher(["END"])
    assert stops.feed("abc E") == "abc "
    assert stops.feed("N") == ""
    assert stops.feed("Dxyz") == ""
    assert stops.stopped
    assert stops.flush() == ""


def test_stop_matcher_releases_a_false_alarm() -> None:
    stops = StopMatcher(["END", "STOP"])
    assert stops.feed("wait ST") == "wait "
    assert stops.feed("OCK") == "STOCK"
    assert stops.feed(" E") == " "
    assert stops.flush() == "E"
    assert not stops.stopped


def test_stop_matcher_picks_the_earliest_of_several_stops() -> None:
    stops = StopMatcher(["b", "a"])
    assert stops.feed("xxab") == "xx"
    assert stops.stopped


def test_no_stop_strings_pass_text_through() -> None:
    stops = StopMatcher([])
    assert stops.feed("anything") == "anything"
    assert stops.flush() == ""
