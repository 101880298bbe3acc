"""Each audio's Whisper features are extracted once (models.common.AudioFeatureCache).

A conversation's prompt carries every earlier turn's audio, and Qwen2.5-Omni's processor pads each
one's features to 30 s. The cache extracts the audios one at a time and keeps them by content; the
processor's output must stay exactly what it is without the cache.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_harness import Harness, request, token_ids

from omni_runtime.contract.engine import MediaInput
from omni_runtime.models.common import AudioFeatureCache
from omni_runtime.models.qwen2_5_omni.loader import load_processor
from omni_runtime.models.whisper_features import short_features

RATE = 16000
ONE_AUDIO_BYTES = 128 * 3000 * 4 + 3000 * 4  # 128 mel bins x 30 s of frames (float32), and the mask (int32)


def tone(seconds: float, hz: float, *, noise: float = 0.0, seed: int = 0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    wave = 0.3 * np.sin(2 * np.pi * hz * t)
    wave += noise * np.random.default_rng(seed).standard_normal(t.size)
    return wave.astype(np.float32)


def chat(n_audios: int) -> str:
    processor = load_processor(None)
    content = [{"type": "audio"} for _ in range(n_audios)] + [{"type": "text", "text": "What was said?"}]
    messages = [{"role": "user", "content": content}]
    return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


@pytest.fixture(scope="module")
def processors() -> tuple[object, object]:
    """The stock processor and one whose feature extractor is cached."""
    stock, cached = load_processor(None), load_processor(None)
    cached.feature_extractor = AudioFeatureCache(cached.feature_extractor)
    return stock, cached


@pytest.mark.parametrize(
    "audios",
    [
        [tone(1.5, 440.0)],
        [tone(0.7, 220.0), tone(2.3, 660.0, noise=0.05), tone(4.0, 330.0, noise=0.2, seed=1)],
        [tone(0.01, 1000.0), tone(29.9, 120.0, noise=0.01)],  # 10 ms, and nearly the 30 s window
        [np.zeros(16000, dtype=np.float32), tone(29.98, 80.0)],  # silence; too long for the short path
    ],
    ids=["one", "three-lengths", "edges", "silence-and-long"],
)
def test_the_processor_output_is_exactly_the_stock_one(processors, audios: list[np.ndarray]) -> None:
    stock, cached = processors
    text = chat(len(audios))
    want = stock(text=[text], audio=audios, return_tensors="pt")
    for _ in range(2):  # extracted, then from the cache
        got = cached(text=[text], audio=audios, return_tensors="pt")
        assert got["input_ids"].tolist() == want["input_ids"].tolist()
        assert torch.equal(got["input_features"], want["input_features"])
        assert torch.equal(got["feature_attention_mask"], want["feature_attention_mask"])
    assert cached.feature_extractor.short_path is True  # checked on this machine's first audio


def test_a_growing_conversation_extracts_only_its_new_audio() -> None:
    processor = load_processor(None)
    cache = AudioFeatureCache(processor.feature_extractor)
    processor.feature_extractor = cache
    turns = [tone(1.0 + k / 2, 200.0 + 100 * k, noise=0.02, seed=k) for k in range(4)]
    seen = []
    for n in range(1, len(turns) + 1):  # turn n sends turns 1..n
        processor(text=[chat(n)], audio=turns[:n], return_tensors="pt")
        seen.append((cache.misses, cache.hits))
    assert seen == [(1, 0), (2, 1), (3, 3), (4, 6)]
    assert cache.bytes == 4 * ONE_AUDIO_BYTES


def test_the_cache_is_bounded_by_bytes_and_keeps_the_latest() -> None:
    processor = load_processor(None)
    cache = AudioFeatureCache(processor.feature_extractor, capacity_bytes=2 * ONE_AUDIO_BYTES)
    processor.feature_extractor = cache
    a, b, c = (tone(1.0, hz) for hz in (300.0, 400.0, 500.0))
    for wave in (a, b, c, c, a):
        processor(text=[chat(1)], audio=[wave], return_tensors="pt")
    assert cache.bytes == 2 * ONE_AUDIO_BYTES
    # a was evicted by c, then extracted again: misses a, b, c, a; one hit (c)
    assert (cache.misses, cache.hits) == (4, 1)


def test_features_that_depend_on_the_batch_are_not_kept() -> None:
    """Padding to the longest audio (Qwen3-Omni's processor) makes one audio's features depend on
    the others in its request: such calls go straight to the extractor."""
    extractor = load_processor(None).feature_extractor
    cache = AudioFeatureCache(extractor)
    audios = [tone(0.5, 300.0), tone(1.0, 400.0)]
    kwargs = {"sampling_rate": RATE, "padding": True, "return_attention_mask": True, "return_tensors": "pt"}
    got, want = cache(audios, **kwargs), extractor(audios, **kwargs)
    assert torch.equal(got["input_features"], want["input_features"])
    assert (cache.misses, cache.hits, cache.bytes) == (0, 0, 0)
    assert cache.hop_length == extractor.hop_length  # attributes pass through


def test_the_engine_extracts_a_resent_audio_once(speech_engine: Harness) -> None:
    """Through the engine: the same audio asked about twice (as a conversation resends it) is
    extracted on the first request only, and both replies are the same (greedy)."""
    cache = speech_engine.engine.adapter.audio_features
    clip = MediaInput(kind="audio", data=tone(1.2, 523.0, noise=0.05, seed=7), sample_rate=RATE)
    misses, hits = cache.misses, cache.hits
    first = speech_engine.collect(request("What is this sound?", max_tokens=6, media=(clip,)))
    assert (cache.misses - misses, cache.hits - hits) == (1, 0)
    again = speech_engine.collect(request("What is this sound?", max_tokens=6, media=(clip,)))
    assert (cache.misses - misses, cache.hits - hits) == (1, 1)
    assert token_ids(again) == token_ids(first)


WHISPER_KWARGS = {
    "sampling_rate": RATE,
    "padding": "max_length",
    "return_attention_mask": True,
    "return_tensors": "pt",
}


@pytest.mark.parametrize(
    "samples",
    [1, 159, 160, 161, 400, 4000, 16000, 24000, 88_000, 160_000 - 80, 320_000, 479_200],
)
def test_short_features_equal_the_extractors_to_the_bit(samples: int) -> None:
    """Over the audio and two FFT windows of zeros, every frame and the mask are the extractor's
    own (hop multiples and not, a sample, the longest audio that fits)."""
    extractor = load_processor(None).feature_extractor
    rng = np.random.default_rng(samples)
    wave = (0.25 * rng.standard_normal(samples) * np.sin(np.arange(samples) / 700.0)).astype(np.float32)
    want = extractor([wave], **WHISPER_KWARGS)
    got = short_features(extractor, wave, WHISPER_KWARGS)
    assert got is not None
    for name in ("input_features", "attention_mask"):
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name


@pytest.mark.parametrize(
    ("samples", "changes", "why"),
    [
        (479_201, {}, "the audio and two FFT windows pass 30 s"),
        (16000, {"do_normalize": True}, "normalised features"),
        (16000, {"sampling_rate": 24000}, "another rate: the extractor's own error"),
        (16000, {"max_length": 16000}, "another window length"),
    ],
)
def test_short_features_decline_what_they_do_not_cover(samples: int, changes: dict, why: str) -> None:
    extractor = load_processor(None).feature_extractor
    assert (
        short_features(extractor, np.zeros(samples, dtype=np.float32), {**WHISPER_KWARGS, **changes}) is None
    ), why


class Nudged:
    """An extractor whose features are a hair off the short path's (as another machine's
    arithmetic might be)."""

    def __init__(self, extractor: object) -> None:
        self.extractor = extractor

    def __getattr__(self, name: str) -> object:
        return getattr(self.extractor, name)

    def __call__(self, audio: object, **kwargs: object) -> object:
        out = self.extractor(audio, **kwargs)
        out["input_features"] = out["input_features"] + 1e-6
        return out


def test_a_short_path_that_differs_is_turned_off() -> None:
    processor = load_processor(None)
    nudged = Nudged(processor.feature_extractor)
    cache = AudioFeatureCache(nudged)
    for k in range(3):
        wave = tone(1.0 + k, 300.0 + 50 * k)
        got = cache([wave], **WHISPER_KWARGS)
        assert torch.equal(got["input_features"], nudged([wave], **WHISPER_KWARGS)["input_features"])
    assert cache.short_path is False and cache.short_calls == 0


def test_short_features_equal_the_extractors_over_random_audio() -> None:
    """Thirty random lengths, levels and envelopes (quiet passages where the floor binds)."""
    extractor = load_processor(None).feature_extractor
    rng = np.random.default_rng(2026)
    for _ in range(30):
        samples = int(rng.integers(1, 29 * RATE))
        envelope = np.abs(np.sin(np.arange(samples) / rng.uniform(200.0, 20000.0))) ** rng.uniform(1, 8)
        wave = (rng.uniform(0.001, 0.9) * rng.standard_normal(samples) * envelope).astype(np.float32)
        want = extractor([wave], **WHISPER_KWARGS)
        got = short_features(extractor, wave, WHISPER_KWARGS)
        assert got is not None and torch.equal(got["input_features"], want["input_features"]), samples
        assert torch.equal(got["attention_mask"], want["attention_mask"]), samples
