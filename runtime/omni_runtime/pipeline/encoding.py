"""A request's encoder stages through the encoder cache, and media encoded ahead of a request.

`MediaEncoders.encode` replaces running the audio and vision encoders on a prompt's whole media:
it cuts the media into units (`encoder_cache.split_units`), serves each from the cache or sends it
to its encoder (all concurrently, so the encoder workers still batch them), and joins the outputs
in prompt order. `MediaEncoders.prefetch` is the early work of streaming input: it preprocesses
media that a later request will carry and encodes it into the cache, in a task of its own, so
the request finds it done (or joins it under way).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from omni_runtime.contract.adapter import OmniAdapter, Prompt
from omni_runtime.contract.engine import ChatTurn, GenerationRequest, MediaInput
from omni_runtime.pipeline.encoder_cache import EncoderCache, Unit, join_outputs, split_units, unit_key
from omni_runtime.pipeline.service import StageCalls

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrefetchCounters:
    submitted: int = 0  # prefetch calls that started work
    done: int = 0  # of those, finished (their units are in the cache)
    failed: int = 0  # preprocessing or an encoder refused the media (the request will say why)


def _nbytes(value: Any) -> int:
    return int(value.numel() * value.element_size()) if value is not None else 0


def _cat(parts: list[Any]) -> Any:
    import torch  # only ever called with encoder outputs, once torch is loaded

    return parts[0] if len(parts) == 1 else torch.cat(parts)


class MediaEncoders:
    def __init__(self, stages: StageCalls, adapter: OmniAdapter, *, cache_bytes: int) -> None:
        self.stages = stages
        self.adapter = adapter
        self.cache = EncoderCache(cache_bytes, size_of=_nbytes)
        self.video_groups = adapter.video_groups_independent
        self.audio_chunk = adapter.audio_chunk_frames
        self._tasks: set[asyncio.Task[None]] = set()
        self.submitted = self.done = self.failed = 0

    def counters(self) -> PrefetchCounters:
        return PrefetchCounters(submitted=self.submitted, done=self.done, failed=self.failed)

    async def encode(self, prompt: Prompt, *, whole_audio_chunks: bool = False) -> tuple[Any, Any, Any]:
        """The prompt's (audio, image, video) encoder outputs, each unit encoded at most once.

        ``whole_audio_chunks``: the audio is a prefix of audio still arriving, so only its whole
        chunks are encoded (its last, partial chunk will differ once more audio follows)."""
        units = split_units(prompt, video_groups=self.video_groups, audio_chunk=self.audio_chunk)
        if whole_audio_chunks:
            units = [
                u
                for u in units
                if u.kind != "audio" or int(u.inputs["feature_attention_mask"].shape[-1]) == self.audio_chunk
            ]
        if not units:
            return None, None, None
        keys = await asyncio.to_thread(lambda: [unit_key(unit) for unit in units])
        outputs = await asyncio.gather(
            *(self.cache.get(key, partial(self._run, unit)) for unit, key in zip(units, keys, strict=True))
        )
        joined = join_outputs(units, list(outputs), _cat)
        return joined["audio"], joined["image"], joined["video"]

    async def _run(self, unit: Unit) -> Any:
        if unit.kind == "audio":
            return await self.stages.encode_audio(unit.inputs)
        return (await self.stages.encode_vision(unit.inputs))[unit.kind]

    def prefetch(self, media: Sequence[MediaInput], *, audio_prefix: bool = False) -> bool:
        """Start encoding ``media`` into the cache; False when nothing was started (no media, or
        no cache to keep the result in). ``audio_prefix``: the audio is the start of speech still
        arriving: only its whole chunks are encoded (and nothing without chunked audio)."""
        if not media or not self.cache.enabled or (audio_prefix and not self.audio_chunk):
            return False
        self.submitted += 1
        task = asyncio.get_running_loop().create_task(self._prefetch(tuple(media), audio_prefix))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _prefetch(self, media: tuple[MediaInput, ...], audio_prefix: bool = False) -> None:
        request = GenerationRequest(request_id="prefetch", turns=(ChatTurn(role="user", media=media),))
        try:
            prompt = await self.stages.preprocess(request)
            await self.encode(prompt, whole_audio_chunks=audio_prefix)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the request that carries this media reports the fault
            self.failed += 1
            log.debug("prefetch of %d media failed: %s", len(media), exc)
            return
        self.done += 1

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.cache.clear()
