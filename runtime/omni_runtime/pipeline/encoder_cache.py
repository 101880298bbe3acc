"""Encoder outputs kept by content, so media encoded ahead of a request is not encoded again.

A streaming-input session sends each image, and each pair of video frames, through its encoder
as it arrives (``PipelineEngine.prefetch_media``); the request built at the end of input finds
those outputs here and only what is new reaches the encoders. The cache is exact by
construction: a unit's key is a digest of its *preprocessed* tensors, so an output is reused only
for bit-identical encoder input, and any change (another resize, another frame count) is a miss.

A prompt's encoder inputs are cut into units whose encodings do not depend on each other (the
`Prompt` contract's geometry: ``pixel_values`` rows are ``t*h*w`` patches per grid row): one
image, one audio (its valid feature frames), one video, or, where the adapter says its vision
tower attends within each temporal patch group (`OmniAdapter.video_groups_independent`), one
group of a video. Outputs are joined back in prompt order. Bounded by bytes (LRU); a unit being
encoded is shared with every request that asks for it meanwhile, so a request arriving while its
media is still being prefetched waits for that work instead of repeating it.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from omni_runtime.contract.adapter import Prompt

UnitKind = Literal["audio", "image", "video"]


@dataclass(frozen=True)
class Unit:
    """One independently encodable piece of a prompt's media: ``inputs`` is one encoder batch item."""

    kind: UnitKind
    owner: int  # which audio / image / video of the prompt it belongs to
    inputs: dict[str, Any]


@dataclass(frozen=True)
class CacheCounters:
    hits: int = 0  # units served from the cache or from an encoding already under way
    misses: int = 0  # units sent to an encoder
    evictions: int = 0
    entries: int = 0
    bytes: int = 0
    capacity_bytes: int = 0


def split_units(prompt: Prompt, *, video_groups: bool, audio_chunk: int | None = None) -> list[Unit]:
    """The prompt's encoder inputs as independent units, audio first, then images, then videos.

    ``audio_chunk`` (`OmniAdapter.audio_chunk_frames`): each audio is cut into units of that many
    feature frames (the last one shorter), so the chunks of speech encoded while it was still
    being spoken are found again when the whole utterance arrives."""
    units: list[Unit] = []
    if prompt.audio is not None:
        features, mask = prompt.audio["input_features"], prompt.audio["feature_attention_mask"]
        for i in range(int(mask.shape[0])):
            length = int(mask[i].sum())
            step = audio_chunk or length
            for start in range(0, length, max(step, 1)):
                end = min(start + step, length)
                units.append(
                    Unit(
                        "audio",
                        i,
                        {
                            "input_features": features[i : i + 1, :, start:end].contiguous(),
                            "feature_attention_mask": mask[i : i + 1, start:end].contiguous(),
                        },
                    )
                )
    if prompt.images is not None:
        units += _vision_units(
            "image", prompt.images["pixel_values"], prompt.images["image_grid_thw"], groups=False
        )
    if prompt.videos is not None:
        units += _vision_units(
            "video",
            prompt.videos["pixel_values_videos"],
            prompt.videos["video_grid_thw"],
            groups=video_groups,
        )
    return units


def _vision_units(kind: UnitKind, pixels: Any, grid: Any, *, groups: bool) -> list[Unit]:
    pixel_key, grid_key = (
        ("pixel_values", "image_grid_thw") if kind == "image" else ("pixel_values_videos", "video_grid_thw")
    )
    units, start = [], 0
    for owner, (t, h, w) in enumerate(grid.tolist()):
        pieces = [(1, h * w)] * t if groups else [(t, t * h * w)]
        for frames, rows in pieces:
            row = grid[owner : owner + 1].clone()
            row[0, 0] = frames
            units.append(
                Unit(kind, owner, {pixel_key: pixels[start : start + rows].contiguous(), grid_key: row})
            )
            start += rows
    return units


def unit_key(unit: Unit) -> str:
    """A digest of the unit's kind and tensors (shape, dtype and bytes): equal only for equal input."""
    digest = hashlib.blake2b(unit.kind.encode(), digest_size=20)
    for name in sorted(unit.inputs):
        tensor = unit.inputs[name].detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(_raw_bytes(tensor))
    return digest.hexdigest()


def _raw_bytes(tensor: Any) -> bytes:
    try:
        return bytes(tensor.numpy().tobytes())
    except TypeError:  # a dtype numpy lacks (bfloat16): its bits, through a same-width integer view
        import torch

        return bytes(
            tensor.view(torch.int16 if tensor.element_size() == 2 else torch.uint8).numpy().tobytes()
        )


def join_outputs(units: list[Unit], outputs: list[Any], cat: Callable[[list[Any]], Any]) -> dict[str, Any]:
    """Per kind, the units' outputs concatenated in prompt order (None where the prompt has none)."""
    joined: dict[str, Any] = {"audio": None, "image": None, "video": None}
    for kind in joined:
        parts = [out for unit, out in zip(units, outputs, strict=True) if unit.kind == kind]
        if parts:
            joined[kind] = cat(parts)
    return joined


class EncoderCache:
    """LRU of encoder outputs by unit key, bounded by bytes; shares encodings under way."""

    def __init__(self, capacity_bytes: int, *, size_of: Callable[[Any], int]) -> None:
        self.capacity = capacity_bytes
        self.size_of = size_of
        self._entries: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._pending: dict[str, asyncio.Task[Any]] = {}
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def counters(self) -> CacheCounters:
        return CacheCounters(
            hits=self.hits,
            misses=self.misses,
            evictions=self.evictions,
            entries=len(self._entries),
            bytes=self.bytes,
            capacity_bytes=self.capacity,
        )

    async def get(self, key: str, encode: Callable[[], Awaitable[Any]]) -> Any:
        """The output for ``key``: kept, being encoded (joined), or encoded now and kept."""
        if not self.enabled:
            self.misses += 1
            return await encode()
        if key in self._entries:
            self._entries.move_to_end(key)
            self.hits += 1
            return self._entries[key][0]
        task = self._pending.get(key)
        if task is not None:
            self.hits += 1
        else:
            self.misses += 1
            task = asyncio.get_running_loop().create_task(self._encode(key, encode))
            self._pending[key] = task
            task.add_done_callback(_retrieve)
        # Shielded: a request cancelled while waiting leaves the encoding to those that share it.
        return await asyncio.shield(task)

    async def _encode(self, key: str, encode: Callable[[], Awaitable[Any]]) -> Any:
        try:
            value = await encode()
            self._put(key, value)
            return value
        finally:
            self._pending.pop(key, None)

    def _put(self, key: str, value: Any) -> None:
        size = self.size_of(value)
        if size > self.capacity:
            return  # larger than the whole cache: used by its request, not kept
        self._entries[key] = (value, size)
        self.bytes += size
        while self.bytes > self.capacity:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.bytes -= dropped
            self.evictions += 1

    def clear(self) -> None:
        for task in self._pending.values():
            task.cancel()
        self._entries.clear()
        self.bytes = 0


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a failed encoding's exception as seen when every waiter was cancelled before it ended."""
    if not task.cancelled():
        task.exception()
