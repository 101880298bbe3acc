"""The stages hosted in this process, each with its own worker thread (``service.StageCalls``).

``LocalStages`` runs the adapter's stage compute in this process; ``remote.LinkedStages`` offers
the same calls through a stage link for stages in another process, and ``stage_set.StageSet``
routes the engine's calls between them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import asdict
from typing import Any

from omni_runtime.contract import switches
from omni_runtime.contract.adapter import OmniAdapter, Prompt, ThinkerPrompt, Vocoder, window_shape
from omni_runtime.contract.engine import EngineError, GenerationRequest, ProcessStats, StageLoad
from omni_runtime.contract.options import EngineOptions
from omni_runtime.contract.stages import Stage
from omni_runtime.executor.gpu_memory import gpu_memory
from omni_runtime.pipeline import deadlines
from omni_runtime.pipeline.remote import LinkedStages
from omni_runtime.pipeline.scheduler import ThinkerScheduler
from omni_runtime.pipeline.segmenter import CodecSegmenter, family_config, with_busy_streams
from omni_runtime.pipeline.talker import TalkerScheduler
from omni_runtime.pipeline.workers import BatchingWorker, StageThread, TimeCounts

log = logging.getLogger(__name__)

TALKER_SLOTS = 32  # talker rows: every speech stream of a full worker decodes in one batch
VOCODER_BATCH = 16  # windows per vocoder call: its cost is mostly fixed, so more streams share it


class LocalStages:
    """Workers for the stages hosted in this process (any subset of the pipeline's stages)."""

    def __init__(self, adapter: OmniAdapter, options: EngineOptions, *, hosted: frozenset[str]) -> None:
        self.adapter = adapter
        self.options = options
        self.hosted = hosted
        self.threads: dict[str, StageThread] = {}
        self.audio: BatchingWorker[dict[str, Any], Any] | None = None
        self.vision: BatchingWorker[dict[str, Any], dict[str, Any]] | None = None
        self.vision_link: LinkedStages | None = None  # image-encoder TP in its own stage process
        self.vocoder_worker: BatchingWorker[dict[str, Any], Any] | None = None
        self.thinker: ThinkerScheduler | None = None
        self.talker: TalkerScheduler | None = None
        self.vocoder: Vocoder | None = None
        self._pre_pool = StageThread("preprocessing")
        self.prompting = 0  # requests in their prompt phase (the engine counts them)

    def _thread(self, name: str) -> StageThread:
        if name not in self.threads:
            self.threads[name] = StageThread(name, initializer=self.adapter.thread_initializer(name))
        return self.threads[name]

    async def start(self) -> None:
        adapter, options = self.adapter, self.options
        try:  # first: the engine's segmenters and the vocoder's warm-up sizes follow it
            adapter.codec_windows = with_busy_streams(
                adapter.codec_windows, os.environ.get("OMNI_BUSY_STREAMS")
            )
        except ValueError as exc:
            raise EngineError(str(exc), param="OMNI_BUSY_STREAMS") from None
        if "audio_encoder" in self.hosted:
            self.audio = BatchingWorker(
                "audio_encoder", adapter.encode_audio, thread=self._thread("audio_encoder")
            )
            self.audio.start()
        vision_address = adapter.vision_stage_address
        if "image_encoder" in self.hosted and vision_address is not None:
            self.vision_link = LinkedStages.connect(vision_address)
        elif "image_encoder" in self.hosted:
            self.vision = BatchingWorker(
                "image_encoder", adapter.encode_vision, thread=self._thread("image_encoder")
            )
            self.vision.start()
        if "thinker" in self.hosted:
            try:  # opt-in: an idle thinker holds a burst's first prompts for the rest (scheduler.gather_wait)
                gather_ms = switches.read("OMNI_GATHER_MS") or 0.0
            except ValueError as exc:
                raise EngineError(str(exc), param="OMNI_GATHER_MS") from None
            try:  # read before the thinker loads: a wrong value costs no model load
                ahead = switches.choice("OMNI_THINKER_AHEAD")
            except ValueError as exc:
                raise EngineError(str(exc), param="OMNI_THINKER_AHEAD") from None
            thread = self._thread("thinker")
            runner = await thread.run(
                lambda: adapter.thinker_runner(slots=options.max_batch_size, max_len=options.max_model_len)
            )
            on_gpu = str(getattr(runner, "device", "cpu")).startswith("cuda")
            self.thinker = ThinkerScheduler(
                runner,
                thread=thread,
                max_batch=options.max_batch_size,
                max_len=options.max_model_len,
                eos_token_ids=adapter.eos_token_ids,
                session_kv_bytes=options.session_kv_mb << 20,
                gather_s=gather_ms / 1000,
                incoming=lambda: self.prompting,
                shared_prefixes=switches.flag("OMNI_SHARED_PREFIX"),
                ahead=ahead == "on" or (ahead == "auto" and on_gpu),
            )
            self.thinker.start()
        if "talker" in self.hosted:
            thread = self._thread("talker")
            slots = min(options.max_batch_size, TALKER_SLOTS)
            max_len = options.max_model_len + 4096
            talker_runner = await thread.run(lambda: adapter.talker_runner(slots=slots, max_len=max_len))
            self.talker = TalkerScheduler(
                talker_runner,
                thread=thread,
                max_batch=slots,
                max_len=max_len,
                session_kv_bytes=options.session_kv_mb << 20,
            )
            self.talker.start()
            self.vocoder = await self._thread("vocoder").run(adapter.vocoder)
            self.vocoder_worker = BatchingWorker(
                "talker_stream",
                self._synthesize_batch,
                thread=self._thread("vocoder"),
                max_batch=VOCODER_BATCH,
                order=window_priority,  # first windows, then the stream closest to an underrun
                group=window_shape,  # one window shape per call: an urgent window waits one replay
            )
            # Opt-in: far windows out of nearer ones' calls, and their calls short (with near: while a
            # stream is near; the engine gives the worker its play heads). deadlines.FarWindows.
            try:
                self.vocoder_worker.far = deadlines.far_windows(os.environ.get("OMNI_VOCODER_FAR"))
            except ValueError as exc:
                raise EngineError(str(exc), param="OMNI_VOCODER_FAR") from None
            self.vocoder_worker.start()
        if self.vision_link is not None:  # it loaded while the stages above did
            await self.vision_link.wait_ready()

    async def warmup(self) -> None:
        """Capture CUDA graphs before the first request (no-op on the CPU)."""
        if self.thinker is not None:
            await self.thinker.thread.run(self.thinker.runner.warmup)
        if self.talker is not None:
            await self.talker.thread.run(self.talker.runner.warmup)
        if self.vocoder is not None:
            sizes = CodecSegmenter(family_config(self.adapter.codec_windows)).recurring_sizes()
            await self._thread("vocoder").run(self.vocoder.warmup, sizes)

    async def stop(self) -> None:
        for component in (self.thinker, self.talker, self.audio, self.vision, self.vocoder_worker):
            if component is not None:
                await component.stop()
        close = getattr(self.thinker.runner, "close", None) if self.thinker is not None else None
        if close is not None and self.thinker is not None:  # e.g. tensor-parallel followers
            await self.thinker.thread.run(close)
        if self.vision_link is not None:
            await self.vision_link.close()
        await asyncio.to_thread(self.adapter.close_vision)  # image-encoder TP processes, if any
        for thread in self.threads.values():
            thread.shutdown()
        self._pre_pool.shutdown()

    # -- stage calls -------------------------------------------------------------------------------
    async def preprocess(self, request: GenerationRequest) -> Prompt:
        return await self._pre_pool.run(self.adapter.preprocess, request)

    async def encode_audio(self, audio: dict[str, Any]) -> Any:
        assert self.audio is not None
        return await self.audio.submit(audio)

    async def encode_vision(self, vision: dict[str, Any]) -> dict[str, Any]:
        if self.vision_link is not None:
            return await self.vision_link.encode_vision(vision)
        assert self.vision is not None
        return await self.vision.submit(vision)

    async def aggregate(self, prompt: Prompt, *, audio: Any, image: Any, video: Any) -> ThinkerPrompt:
        return await self._thread("mm_aggregate").run(
            lambda: self.adapter.aggregate(prompt, audio=audio, image=image, video=video)
        )

    async def synthesize(self, item: dict[str, Any]) -> Any:
        assert self.vocoder_worker is not None
        return await self.vocoder_worker.submit(item)

    def _synthesize_batch(self, items: list[dict[str, Any]]) -> list[Any]:
        assert self.vocoder is not None  # the worker starts once the vocoder is loaded
        return self.vocoder.synthesize_many(items)

    def load(self) -> tuple[StageLoad, ...]:
        """Busy time, calls, items and cancellations of each stage thread (``omni_stage_*`` metrics)."""
        items: dict[str, int] = {}
        cancelled: dict[str, int] = {}
        waits: dict[str, TimeCounts] = {}
        for worker in (self.audio, self.vision, self.vocoder_worker):
            if worker is not None:
                name = worker.thread.name
                items[name] = items.get(name, 0) + worker.items
                cancelled[name] = cancelled.get(name, 0) + worker.dropped
                waits.setdefault(name, TimeCounts()).add(worker.waits)
        for scheduler in (self.thinker, self.talker):
            if scheduler is not None:
                items[scheduler.thread.name] = scheduler.rows_stepped
                cancelled[scheduler.thread.name] = scheduler.cancelled
                waits.setdefault(scheduler.thread.name, TimeCounts()).add(scheduler.waits)
        # The preprocessing pool exists everywhere but works only where preprocessing is hosted.
        pre = [self._pre_pool] if "preprocessing" in self.hosted else []
        threads = [*pre, *self.threads.values()]
        return tuple(
            StageLoad(
                stage=t.name,
                busy_s=t.busy_s,
                calls=t.calls,
                items=items.get(t.name, t.calls),
                cancelled=cancelled.get(t.name, 0),
                after_cancel_s=t.after_cancel_s,
                working=not t.idle,
                waits=waits[t.name].snapshot() if t.name in waits else (),
            )
            for t in threads
        )

    @property
    def quiet(self) -> bool:
        """No scheduler row, no queued item and no stage call running or waiting: nothing left of
        any request (tests wait for it after a cancel before reading the counters)."""
        rows = any(s is not None and s.running for s in (self.thinker, self.talker))
        queued = any(w is not None and w.queue_depth for w in (self.audio, self.vision, self.vocoder_worker))
        return not rows and not queued and all(t.idle for t in (self._pre_pool, *self.threads.values()))

    def process_stats(self) -> ProcessStats:
        """This process's counters: its stage threads, its GPUs, the kept session KV where the
        thinker runs here (what a stage process answers ``stats.get`` with)."""
        kv = {} if self.thinker is None else asdict(self.thinker.kv.counters())
        talker = {} if self.talker is None else asdict(self.talker.kv.counters())
        return ProcessStats(
            process=",".join(s.value for s in Stage if s.value in self.hosted),
            queue_depth=self.queue_depth(),
            running_batch=0 if self.thinker is None else self.thinker.running_count,
            max_running_batch=0 if self.thinker is None else self.thinker.max_running_batch,
            thinker_steps=0 if self.thinker is None else self.thinker.steps,
            thinker_steps_ahead=0 if self.thinker is None else self.thinker.steps_ahead,
            stages=self.load(),
            gpus=gpu_memory(),
            session_kv=kv,
            talker_kv=talker,
        )

    def queue_depth(self) -> int:
        depth = 0
        for worker in (self.audio, self.vision):
            if worker is not None:
                depth += worker.queue_depth
        if self.thinker is not None:
            depth += len(self.thinker.waiting)
        return depth


def window_priority(item: dict[str, Any], seq: int) -> deadlines.Priority:
    """A vocoder window's place in line, from the slack its stream had when it was submitted."""
    return deadlines.priority(slack_s=item.get("slack_s"), now=time.monotonic(), seq=seq)
