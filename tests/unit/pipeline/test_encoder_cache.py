"""The encoder cache: units cut from a prompt's media, keys equal only for equal input, LRU by
bytes with exact counters, encodings under way shared, failures never kept."""

from __future__ import annotations

import asyncio

import pytest
import torch

from omni_runtime.contract.adapter import Prompt
from omni_runtime.pipeline.encoder_cache import EncoderCache, join_outputs, split_units, unit_key


def prompt() -> Prompt:
    """Two audios padded to 6 frames (4 and 6 valid), two images (2x2, 2x4 patches), a 3-group video."""
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    return Prompt(
        input_ids=[1, 2, 3],
        audio={
            "input_features": torch.arange(2 * 3 * 6, dtype=torch.float32).reshape(2, 3, 6),
            "feature_attention_mask": mask,
        },
        images={
            "pixel_values": torch.arange(12 * 5, dtype=torch.float32).reshape(12, 5),
            "image_grid_thw": torch.tensor([[1, 2, 2], [1, 2, 4]]),
        },
        videos={
            "pixel_values_videos": torch.arange(3 * 4 * 5, dtype=torch.float32).reshape(12, 5),
            "video_grid_thw": torch.tensor([[3, 2, 2]]),
            "video_second_per_grid": torch.tensor([1.0]),
        },
    )


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        # (kind, owner, rows of its first tensor, its grid or feature frames)
        (
            True,
            [("audio", 0, 1, 4), ("audio", 1, 1, 6), ("image", 0, 4, [1, 2, 2]), ("image", 1, 8, [1, 2, 4]),
             ("video", 0, 4, [1, 2, 2]), ("video", 0, 4, [1, 2, 2]), ("video", 0, 4, [1, 2, 2])],
        ),
        (
            False,
            [("audio", 0, 1, 4), ("audio", 1, 1, 6), ("image", 0, 4, [1, 2, 2]), ("image", 1, 8, [1, 2, 4]),
             ("video", 0, 12, [3, 2, 2])],
        ),
    ],
)  # fmt: skip
def test_split_units(groups: bool, expected: list) -> None:
    units = split_units(prompt(), video_groups=groups)
    got = []
    for unit in units:
        first = next(iter(unit.inputs.values()))
        shape = (
            int(unit.inputs["feature_attention_mask"].shape[1])
            if unit.kind == "audio"
            else next(v for k, v in unit.inputs.items() if k.endswith("grid_thw"))[0].tolist()
        )
        got.append((unit.kind, unit.owner, int(first.shape[0]), shape))
    assert got == expected
    # Every pixel row lands in exactly one unit, in order.
    video = torch.cat([u.inputs["pixel_values_videos"] for u in units if u.kind == "video"])
    assert torch.equal(video, prompt().videos["pixel_values_videos"])
    # An audio unit holds only its valid frames.
    assert torch.equal(units[0].inputs["input_features"], prompt().audio["input_features"][0:1, :, :4])


def test_keys_are_equal_only_for_equal_input() -> None:
    a, b = split_units(prompt(), video_groups=True), split_units(prompt(), video_groups=True)
    assert [unit_key(u) for u in a] == [unit_key(u) for u in b]
    keys = [unit_key(u) for u in a]
    assert len(set(keys)) == len(keys)  # every unit here has other content
    changed = prompt()
    changed.images["pixel_values"][0, 0] += 0.5  # one value of the first image
    assert unit_key(split_units(changed, video_groups=True)[2]) != keys[2]
    assert unit_key(split_units(changed, video_groups=True)[3]) == keys[3]
    # Half-precision inputs key by their bits; a dtype change is another key.
    half = prompt()
    half.images["pixel_values"] = half.images["pixel_values"].to(torch.bfloat16)
    bf16 = unit_key(split_units(half, video_groups=True)[2])
    assert bf16 == unit_key(split_units(half, video_groups=True)[2]) != keys[2]


def test_join_outputs_concatenates_in_prompt_order() -> None:
    units = split_units(prompt(), video_groups=True)
    outputs = [torch.full((1, 2), float(i)) for i in range(len(units))]
    joined = join_outputs(units, outputs, torch.cat)
    assert joined["audio"][:, 0].tolist() == [0.0, 1.0]
    assert joined["image"][:, 0].tolist() == [2.0, 3.0]
    assert joined["video"][:, 0].tolist() == [4.0, 5.0, 6.0]
    assert join_outputs(units[:2], outputs[:2], torch.cat)["image"] is None


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize(
    ("capacity", "gets", "hits", "misses", "evictions", "kept"),
    [
        (10, ["a4", "b4", "a4"], 1, 2, 0, ["b", "a"]),
        (10, ["a4", "b4", "c4"], 0, 3, 1, ["b", "c"]),  # a, least recently used, goes
        (10, ["a4", "b4", "a4", "c4"], 1, 3, 1, ["a", "c"]),  # a was used again: b goes
        (10, ["a11", "a11"], 0, 2, 0, []),  # larger than the whole cache: used, never kept
        (0, ["a4", "a4"], 0, 2, 0, []),  # capacity 0: off
    ],
)
def test_lru_by_bytes(
    capacity: int, gets: list[str], hits: int, misses: int, evictions: int, kept: list[str]
) -> None:
    calls: list[str] = []

    async def go() -> EncoderCache:
        cache = EncoderCache(capacity, size_of=len)
        for get in gets:
            key, size = get[0], int(get[1:])

            async def encode(key: str = key, size: int = size) -> str:
                calls.append(key)
                return key * size

            assert await cache.get(key, encode) == key * size
        return cache

    cache = run(go())
    counters = cache.counters()
    assert (counters.hits, counters.misses, counters.evictions) == (hits, misses, evictions)
    assert list(cache._entries) == kept
    assert counters.bytes == sum(size for _, size in cache._entries.values()) <= max(capacity, 0)
    assert len(calls) == misses


def test_an_encoding_under_way_is_shared_and_a_failure_is_not_kept() -> None:
    async def go() -> tuple[list, EncoderCache, int]:
        cache = EncoderCache(100, size_of=len)
        started = 0
        release = asyncio.Event()

        async def slow() -> str:
            nonlocal started
            started += 1
            await release.wait()
            return "xy"

        waiters = [asyncio.create_task(cache.get("k", slow)) for _ in range(3)]
        await asyncio.sleep(0)
        release.set()
        results = await asyncio.gather(*waiters)

        async def broken() -> str:
            raise RuntimeError("encoder refused")

        failures = await asyncio.gather(
            cache.get("bad", broken), cache.get("bad", broken), return_exceptions=True
        )
        return [results, failures], cache, started

    (results, failures), cache, started = run(go())
    assert results == ["xy"] * 3 and started == 1
    assert all(isinstance(f, RuntimeError) for f in failures)
    counters = cache.counters()
    assert (counters.hits, counters.misses) == (3, 2)  # 2 joined "k", 1 joined "bad"
    assert list(cache._entries) == ["k"]


@pytest.mark.parametrize(
    ("chunk", "frames"),
    [
        (None, [(0, 4), (1, 6)]),  # one unit per audio
        (4, [(0, 4), (1, 4), (1, 2)]),  # audio 1: a whole chunk, then its last 2 frames
        (2, [(0, 2), (0, 2), (1, 2), (1, 2), (1, 2)]),
        (8, [(0, 4), (1, 6)]),  # shorter than a chunk: one unit each
    ],
)
def test_audio_is_cut_into_the_encoders_chunks(chunk: int | None, frames: list) -> None:
    units = [u for u in split_units(prompt(), video_groups=False, audio_chunk=chunk) if u.kind == "audio"]
    assert [(u.owner, int(u.inputs["feature_attention_mask"].shape[1])) for u in units] == frames
    for owner, valid in ((0, 4), (1, 6)):  # the chunks join back into the audio's valid frames
        joined = torch.cat([u.inputs["input_features"] for u in units if u.owner == owner], dim=2)
        assert torch.equal(joined, prompt().audio["input_features"][owner : owner + 1, :, :valid])
