"""A fresh prompt's prefill padded to a (rows, length) bucket, as the CUDA graphs replay it, computes
what the unpadded prefill computes: the same logits, hidden states, kept accept-layer states and
cache entries for every real position, no write to a slot outside the batch, and the same greedy
decode afterwards. On the CPU the padded body runs eagerly (``prefill_padded``); on CUDA the same
body is what each graph captured (tests/gpu/test_engine_cuda.py replays them)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omni_runtime.executor.slot_cache import PrefillShapes, SlotDecoder
from omni_runtime.models.qwen2_5_omni.runners import QwenThinkerRunner


@pytest.mark.parametrize(
    ("slots", "max_len", "rows", "length", "bucket"),
    [
        (32, 4096, 1, 48, (1, 48)),
        (32, 4096, 1, 49, (1, 64)),
        (32, 4096, 3, 7, (4, 8)),
        (32, 4096, 5, 100, (8, 128)),
        (32, 4096, 16, 256, (16, 256)),  # 4096 tokens: the largest graph
        (32, 4096, 17, 100, (32, 128)),  # 32 x 128 = 4096 tokens: still a graph
        (32, 4096, 17, 129, None),  # 32 x 192 tokens: unpadded
        (32, 4096, 1, 257, None),  # longer than the longest bucket
        (6, 4096, 5, 20, (6, 24)),  # the slot count is the last row bucket
        (32, 100, 1, 97, None),  # buckets stop at the decoder's max_len
    ],
)
def test_prefill_buckets(
    slots: int, max_len: int, rows: int, length: int, bucket: tuple[int, int] | None
) -> None:
    shapes = PrefillShapes.for_decoder(slots, max_len)
    assert shapes.bucket(rows, length) == bucket


def test_every_bucket_is_listed_once_and_within_the_token_limit() -> None:
    shapes = PrefillShapes.for_decoder(32, 4096)
    every = shapes.all()
    assert len(every) == len(set(every))
    assert all(r * n <= shapes.max_tokens for r, n in every)
    assert (32, 128) in every and (32, 192) not in every and (1, 256) in every


@pytest.fixture(scope="module")
def thinker(tiny_checkpoint: Path):
    from transformers import Qwen2_5OmniForConditionalGeneration

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(str(tiny_checkpoint), dtype=torch.float32)
    return model.thinker.eval()


@pytest.fixture(scope="module")
def qwen3_thinker(hf_qwen3):
    """Qwen3-Omni's MoE thinker as the runtime runs it, keeping its talker's accept layer."""
    from types import SimpleNamespace

    from omni_runtime.models.qwen3_omni_moe.runners import Qwen3ThinkerRunner

    cfg = hf_qwen3.config.thinker_config
    names = SimpleNamespace(
        text_config=cfg.text_config,
        audio_token_index=cfg.audio_token_id,
        image_token_index=cfg.image_token_id,
        video_token_index=cfg.video_token_id,
    )

    def build() -> SlotDecoder:
        runner = Qwen3ThinkerRunner(
            hf_qwen3.thinker.model.language_model,
            hf_qwen3.thinker.lm_head,
            names,
            slots=6,
            max_len=256,
            dtype=torch.float32,
            device=torch.device("cpu"),
            cuda_graphs=False,
            accept_layer=int(hf_qwen3.config.talker_config.accept_hidden_layer),
        )
        assert runner.decoder.keep_layer is not None  # the tiny talker reads an inner layer
        return runner.decoder

    return build


def _decoder(thinker, *, padded: bool, keep_layer: int | None = None) -> SlotDecoder:
    if not isinstance(thinker, torch.nn.Module):  # Qwen3: a builder; its runner sets the kept layer
        decoder = thinker()
    else:
        decoder = QwenThinkerRunner(
            thinker.model.language_model,
            thinker.lm_head,
            thinker.config,
            slots=6,
            max_len=256,
            dtype=torch.float32,
            device=torch.device("cpu"),
            cuda_graphs=False,
        ).decoder
        decoder.keep_layer = keep_layer
    decoder.prefill_padded = padded
    return decoder


@pytest.fixture(params=["qwen2_5_omni", "qwen3_omni_moe"])
def family_thinker(request: pytest.FixtureRequest):
    return request.getfixturevalue("thinker" if request.param == "qwen2_5_omni" else "qwen3_thinker")


def _prefill(decoder: SlotDecoder, embeds: torch.Tensor, lengths: list[int], slots: list[int]):
    rows, width = embeds.shape[:2]
    positions = torch.arange(width).view(1, 1, -1).expand(3, rows, -1)
    with torch.inference_mode():
        return decoder.prefill(
            slots=slots, embeds=embeds, positions=positions, lengths=lengths, want_hidden=True
        )


@pytest.mark.parametrize(
    ("lengths", "slots"),
    [
        ([13], [2]),  # one row, padded to length 16
        ([7, 12, 3], [0, 4, 1]),  # three rows padded to four (the last repeated), length 16
        ([16, 16], [3, 5]),  # exactly a bucket
    ],
)
def test_padded_prefill_equals_unpadded(family_thinker, lengths: list[int], slots: list[int]) -> None:
    thinker = family_thinker
    torch.manual_seed(0)
    hidden_size = _decoder(thinker, padded=False).out_hidden.shape[-1]
    width = max(lengths)
    embeds = torch.randn(len(lengths), width, hidden_size)
    for k, n in enumerate(lengths):
        embeds[k, n:] = 0.0  # right padding, as right_padded makes it
    plain = _decoder(thinker, padded=False, keep_layer=0)
    padded = _decoder(thinker, padded=True, keep_layer=0)
    sentinel = 7.0  # a slot outside the batch keeps what it held
    outside = next(s for s in range(6) if s not in slots)
    for decoder in (plain, padded):
        for keys in decoder.cache.keys:
            keys[outside].fill_(sentinel)
    want_logits, want_hidden = _prefill(plain, embeds, lengths, slots)
    got_logits, got_hidden = _prefill(padded, embeds, lengths, slots)
    assert padded.prefill_shapes.bucket(len(slots), width) is not None
    assert got_logits.shape == want_logits.shape and got_hidden is not None and want_hidden is not None
    assert got_hidden.shape == want_hidden.shape == (len(lengths), width, hidden_size)
    _assert_same_prefill(
        (plain, want_logits, want_hidden), (padded, got_logits, got_hidden), slots, lengths, [0] * len(slots)
    )
    for keys in padded.cache.keys:
        assert bool((keys[outside] == sentinel).all())


def _assert_same_prefill(want, got, slots: list[int], lengths: list[int], offsets: list[int]) -> None:
    """(decoder, logits, hidden) of the unpadded and the padded prefill: the same logits, hidden
    states and kept layer at every real position, the same cache from each slot's start to its
    prompt's end."""
    (plain, want_logits, want_hidden), (padded, got_logits, got_hidden) = want, got
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-4, atol=1e-4)
    assert plain.kept_hidden is not None and padded.kept_hidden is not None
    for k, n in enumerate(lengths):
        torch.testing.assert_close(got_hidden[k, :n], want_hidden[k, :n], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(padded.kept_hidden[k, :n], plain.kept_hidden[k, :n], rtol=1e-4, atol=1e-4)
    for want_keys, got_keys in zip(plain.cache.keys, padded.cache.keys, strict=True):
        for slot, offset, n in zip(slots, offsets, lengths, strict=True):
            end = offset + n
            torch.testing.assert_close(
                got_keys[slot, :, :end], want_keys[slot, :, :end], rtol=1e-4, atol=1e-4
            )


def test_decode_after_a_padded_prefill_follows_the_same_tokens(family_thinker) -> None:
    thinker = family_thinker
    torch.manual_seed(1)
    hidden_size = _decoder(thinker, padded=False).out_hidden.shape[-1]
    lengths, slots = [9, 5, 11], [0, 1, 2]
    embeds = torch.randn(3, 11, hidden_size)
    tokens = []
    for padded in (False, True):
        decoder = _decoder(thinker, padded=padded)
        logits, _ = _prefill(decoder, embeds, lengths, slots)
        with torch.inference_mode():
            decoder.last_ids[:3].copy_(logits.argmax(-1))
            decoder.lengths[:3].copy_(torch.tensor(lengths))
            steps = []
            for i in range(5):
                out = decoder.decode(3, max_length=max(lengths) + 1 + i)
                steps.append(out.logits.argmax(-1).tolist())
                decoder.last_ids[:3].copy_(out.logits.argmax(-1))
                decoder.lengths[:3] += 1
        tokens.append(steps)
    assert tokens[0] == tokens[1]


@pytest.mark.parametrize("wrong_part", ["logits", "keys"])
def test_the_start_up_check_passes_an_equal_padded_prefill_and_fails_a_wrong_one(
    family_thinker, wrong_part: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``check_prefill_graphs`` (run after the graphs are captured; a False turns them off) against
    the padded body as it is, then with its logits or its cache writes wrong."""
    decoder = _decoder(family_thinker, padded=True)
    with caplog.at_level("INFO", logger="omni_runtime.executor.slot_cache"):
        assert decoder.check_prefill_graphs()
    assert "prefill graphs checked" in caplog.text
    body = decoder._prefill_body

    def wrong(shape: tuple[int, int]) -> None:
        body(shape)
        if wrong_part == "logits":
            decoder._pf["logits"].add_(1.0)
        else:
            decoder.cache.keys[-1][0].add_(1.0)

    decoder._prefill_body = wrong  # type: ignore[method-assign]
    caplog.clear()
    with caplog.at_level("INFO", logger="omni_runtime.executor.slot_cache"):
        assert not decoder.check_prefill_graphs()
    assert "prefill graphs DIFFER" in caplog.text and "prefilling unpadded" in caplog.text


# -- suffixes after a kept prefix, padded to (rows, length, span) buckets (OMNI_SUFFIX_GRAPHS, on by default) --


@pytest.mark.parametrize(
    ("max_len", "rows", "length", "offsets", "bucket"),
    [
        (4096, 1, 21, [40], (1, 32, 256)),  # suffix lengths are 32, 64, 128
        (4096, 1, 21, [224], (1, 32, 256)),  # 224 + 32 = 256: still the first span
        (4096, 1, 21, [225], (1, 32, 512)),
        (4096, 3, 60, [100, 0, 300], (4, 64, 512)),  # the longest prefix sets the span
        (4096, 1, 5, [4064], (1, 32, 4096)),  # the padded suffix ends at the slot's end
        (4096, 1, 5, [4065], None),  # its padding would pass the slot's end: unpadded
        (300, 1, 20, [268], (1, 32, 300)),  # the last span is the decoder's max_len
        (300, 1, 20, [269], None),
        (4096, 1, 129, [10], None),  # longer than the longest suffix length
        (4096, 1, 300, [10], None),  # longer than the longest length bucket
    ],
)
def test_suffix_buckets(
    max_len: int, rows: int, length: int, offsets: list[int], bucket: tuple[int, ...] | None
) -> None:
    shapes = PrefillShapes.for_decoder(32, max_len)
    assert shapes.bucket(rows, length, offsets) == bucket


def _suffix_decoder(thinker, *, padded: bool) -> SlotDecoder:
    decoder = _decoder(thinker, padded=False, keep_layer=0)
    decoder.suffix_padded = padded
    return decoder


def _prefill_at(decoder: SlotDecoder, embeds: torch.Tensor, lengths: list[int], slots: list[int], offsets):
    width = embeds.shape[1]
    positions = torch.stack([torch.arange(o, o + width) for o in offsets])[None].expand(3, -1, -1)
    with torch.inference_mode():
        return decoder.prefill(
            slots=slots,
            embeds=embeds,
            positions=positions,
            lengths=lengths,
            want_hidden=True,
            offsets=list(offsets),
        )


@pytest.mark.parametrize(
    ("offsets", "lengths", "slots"),
    [
        ([30], [13], [2]),  # one row after a prefix of 30, padded to length 16, span 256
        ([12, 40, 5], [7, 12, 3], [0, 4, 1]),  # three prefixes, ragged; rows padded to four
        ([20, 0], [16, 16], [3, 5]),  # a row without a prefix beside one with
    ],
)
def test_padded_suffix_equals_unpadded(
    family_thinker, offsets: list[int], lengths: list[int], slots: list[int]
) -> None:
    """Each row's prefix is prefilled first (unpadded, the same in both decoders); the suffixes
    then run unpadded in one decoder and padded in the other: the same logits, hidden states,
    kept layer and cache entries from each row's prefix to its suffix's end, and a slot outside
    the batch keeps what it held."""
    thinker = family_thinker
    torch.manual_seed(3)
    plain, padded = _suffix_decoder(thinker, padded=False), _suffix_decoder(thinker, padded=True)
    hidden_size = plain.out_hidden.shape[-1]
    prefixes = [torch.randn(1, max(o, 1), hidden_size) for o in offsets]
    width = max(lengths)
    embeds = torch.randn(len(lengths), width, hidden_size)
    for k, n in enumerate(lengths):
        embeds[k, n:] = 0.0
    outside = next(s for s in range(6) if s not in slots)
    for decoder in (plain, padded):
        for keys in decoder.cache.keys:
            keys[outside].fill_(7.0)
        for slot, offset, prefix in zip(slots, offsets, prefixes, strict=True):
            if offset:
                _prefill(decoder, prefix, [offset], [slot])
    want_logits, want_hidden = _prefill_at(plain, embeds, lengths, slots, offsets)
    bodies: list[tuple[int, ...]] = []
    body = padded._prefill_body
    padded._prefill_body = lambda shape: (bodies.append(shape), body(shape))[1]  # type: ignore[method-assign]
    got_logits, got_hidden = _prefill_at(padded, embeds, lengths, slots, offsets)
    assert bodies == [padded.prefill_shapes.bucket(len(slots), width, offsets)] and len(bodies[0]) == 3
    _assert_same_prefill(
        (plain, want_logits, want_hidden), (padded, got_logits, got_hidden), slots, lengths, offsets
    )
    for keys in padded.cache.keys:
        assert bool((keys[outside] == 7.0).all())


def test_decode_after_a_padded_suffix_follows_the_same_tokens(family_thinker) -> None:
    thinker = family_thinker
    torch.manual_seed(4)
    offsets, lengths, slots = [25, 9], [6, 11], [1, 3]
    tokens = []
    for padded in (False, True):
        torch.manual_seed(4)
        decoder = _suffix_decoder(thinker, padded=padded)
        hidden_size = decoder.out_hidden.shape[-1]
        for slot, offset in zip(slots, offsets, strict=True):
            _prefill(decoder, torch.randn(1, offset, hidden_size), [offset], [slot])
        logits, _ = _prefill_at(decoder, torch.randn(2, 11, hidden_size), lengths, slots, offsets)
        with torch.inference_mode():
            # Rows 0 and 1 of the decode batch: move the two slots there first.
            for row, slot in enumerate(slots):
                decoder.move(slot, row, offsets[row] + lengths[row])
            decoder.last_ids[:2].copy_(logits.argmax(-1))
            decoder.lengths[:2].copy_(torch.tensor([o + n for o, n in zip(offsets, lengths, strict=True)]))
            steps = []
            for _ in range(5):
                out = decoder.decode(2, max_length=max(decoder.lengths[:2].tolist()) + 1)
                steps.append(out.logits.argmax(-1).tolist())
                decoder.last_ids[:2].copy_(out.logits.argmax(-1))
                decoder.lengths[:2] += 1
        tokens.append(steps)
    assert tokens[0] == tokens[1]


def test_the_start_up_check_covers_a_padded_suffix(family_thinker, caplog: pytest.LogCaptureFixture) -> None:
    """With suffixes padded, the check also prefills a suffix after a kept prefix both ways; a
    wrong suffix body (its cache writes off by one) fails it."""
    decoder = _suffix_decoder(family_thinker, padded=True)
    with caplog.at_level("INFO", logger="omni_runtime.executor.slot_cache"):
        assert decoder.check_prefill_graphs(shapes=((2, 21, 40),))
    assert "prefill graphs checked" in caplog.text
    body = decoder._prefill_body

    def wrong(shape: tuple[int, ...]) -> None:
        body(shape)
        if len(shape) > 2:
            decoder.cache.keys[-1][0, :, 40].add_(1.0)

    decoder._prefill_body = wrong  # type: ignore[method-assign]
    with caplog.at_level("INFO", logger="omni_runtime.executor.slot_cache"):
        assert not decoder.check_prefill_graphs(shapes=((2, 21, 40),))


def test_the_start_up_suffix_buckets() -> None:
    """Rows 1-8 x lengths 32, 64, 128 x spans 256-1024, captured at start-up (36 per decoder)."""
    shapes = PrefillShapes.for_decoder(32, 4096)
    grid = shapes.suffixes()
    assert len(grid) == len(set(grid)) == 4 * 3 * 3
    assert grid[:3] == [(1, 32, 256), (1, 32, 512), (1, 32, 1024)] and grid[-1] == (8, 128, 1024)
    assert all(shapes.bucket(r, n, [span - n]) == (r, n, span) for r, n, span in grid)
    small = PrefillShapes.for_decoder(2, 300)  # few slots, a short context: rows 1-2, spans 256, 300
    assert small.suffixes() == [(r, n, s) for r in (1, 2) for n in (32, 64, 128) for s in (256, 300)]


def test_with_suffix_graphs_a_suffix_of_a_bucket_not_captured_at_start_up_runs_unpadded(thinker) -> None:
    decoder = _suffix_decoder(thinker, padded=True)
    decoder.suffix_graphs = True  # as on CUDA by default (no graph is replayed here)
    decoder._prefill_graphs = {(1, 24): object(), (1, 32, 256): object()}  # type: ignore[dict-item]
    assert decoder._padded_shape(1, 21, [40]) == (1, 32, 256)  # captured at start-up: replayed
    assert decoder._padded_shape(3, 21, [40]) is None  # (4, 32, 256) was not: unpadded
    assert decoder._padded_shape(3, 21, None) == (4, 24)  # fresh prompts are not affected
    decoder._capturing = True  # start-up (capture_prefills): any bucket may be captured
    assert decoder._padded_shape(3, 21, [40]) == (4, 32, 256)
