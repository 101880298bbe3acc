"""The pipeline engine: one request's path through the stage graph, as an async event stream.

``generate`` runs preprocessing, the encoders (concurrently, through the encoder cache of
encoding.py, which also serves ``prefetch_media``: media encoded ahead of its request), mm_aggregate, then hands the
prompt to the thinker's continuous-batching scheduler. The decode stage (incremental
detokenizer + stop strings) turns tokens into text deltas. For speech, the thinker's reply
vectors feed a talker job as they appear; the segmenter cuts its codec stream into vocoder
windows and audio chunks join the same event stream, so streaming speech starts while the
thinker is still writing. Closing the stream cancels everything the request holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from omni_runtime.contract.adapter import OmniAdapter, RowSampling, TalkerAdmission, ThinkerPrompt
from omni_runtime.contract.engine import (
    FIRST_AUDIO_PHASES,
    AudioChunk,
    EngineError,
    EngineEvent,
    EngineStats,
    Finished,
    GenerationRequest,
    MediaInput,
    ProcessStats,
    TextDelta,
    Usage,
)
from omni_runtime.contract.options import EngineOptions
from omni_runtime.contract.stages import STREAMING_AUDIO, Stage
from omni_runtime.executor.gpu_memory import gpu_memory
from omni_runtime.pipeline.deadlines import (
    FIRST_LINGER_CODES,
    FIRST_LINGER_S,
    THINKER_HOLD_BELOW_S,
    PlaybackClock,
    ahead_slack,
    holds_thinker,
    lingers,
    near_streams,
)
from omni_runtime.pipeline.detokenize import IncrementalDetokenizer, StopMatcher
from omni_runtime.pipeline.encoding import MediaEncoders
from omni_runtime.pipeline.graph import local_stages, pipeline_variant
from omni_runtime.pipeline.scheduler import FinishReason, ThinkerDone, ThinkerJob, ThinkerToken
from omni_runtime.pipeline.segmenter import CodecSegmenter, family_config, widen_to_recurring, window_item
from omni_runtime.pipeline.service import TalkerService
from omni_runtime.pipeline.services import LocalStages
from omni_runtime.pipeline.stage_set import StageSet, attach_remote_stages
from omni_runtime.pipeline.talker import TalkerDone, TalkerJob
from omni_runtime.pipeline.validate import row_sampling, talker_limits, talker_sampling, validate_request
from omni_runtime.pipeline.warmup import warm_prefix
from omni_runtime.pipeline.workers import TimeCounts

log = logging.getLogger(__name__)
# Both families' feature extractors (Whisper's) make one frame per 10 ms of 16 kHz audio.
HOP_SAMPLES = 160
WINDOWS_AHEAD = 2


_STATS_FIELDS = frozenset(f.name for f in fields(EngineStats))


def _stats_fields(prefix: str, counters: dict[str, int]) -> dict[str, int]:
    """A store's counters (conversation_kv.KVCounters by name) as the EngineStats fields it has."""
    return {
        f"{prefix}_{name}": value for name, value in counters.items() if f"{prefix}_{name}" in _STATS_FIELDS
    }


class PipelineEngine:
    """Implements the ``Engine`` protocol of contract/engine.py."""

    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        self.variant = pipeline_variant(options)
        self.hosted = local_stages(options)
        self.model_name = options.model_name or (
            options.model_path.rstrip("/").split("/")[-1] if options.model_path else "tiny"
        )
        self.output_sample_rate = 24000
        self.supports_audio_output = self.variant != "text"
        self.max_model_len = options.max_model_len
        self.adapter: OmniAdapter | None = None
        self.stages: StageSet | None = None
        self.encoders: MediaEncoders | None = None
        self._ready = False
        self._active = 0
        self._remote_stats: tuple[ProcessStats, ...] = ()  # refresh_stats: the stage processes'
        self._remote_stats_failures = 0
        self.load_seconds = 0.0
        # Which audio windows pause the thinker (deadlines.holds_thinker): set in start(), on a GPU
        # the thinker shares with the vocoder; None never pauses it.
        self.thinker_hold_below_s: float | None = None
        self._before_first_audio: set[str] = set()  # streaming speech replies without audio yet (ids)
        self._play_heads: dict[str, PlaybackClock] = {}  # each streaming speech reply's listener (id ->)
        # Streaming speech replies from their acceptance to their end: the load a first window is
        # cut under (a reply still in its prompt or thinker counts, so every reply of a wave that
        # starts together, and one arriving as others end, sees the rest).
        self._speech_replies = 0
        self._busy_first_windows = 0  # of them, those whose first window was cut under load
        # Speech replies whose talker still takes the thinker's text (request ids), and whether a
        # later window's hold waits until no other reply's does (deadlines.holds_thinker).
        self._talkers_on_text: set[str] = set()
        self.holds_spare_text = True
        # Windows of one streaming reply at the vocoder at once (`_stream_windows`); 1: each is cut
        # once the one before came back.
        self.windows_ahead = WINDOWS_AHEAD
        # Codes each streaming reply still needs before its first window is cut (request id ->
        # codes; gone once cut): a ready first window waits for others this close (`lingers`).
        self._first_window_need: dict[str, int] = {}
        self.first_linger_codes = FIRST_LINGER_CODES  # 0: a first window never waits
        self.first_linger_s = FIRST_LINGER_S
        self._lingered_first_windows = 0
        self._first_window_waiters: set[asyncio.Event] = set()  # first windows waiting (`_linger_first`)
        self._first_window_linger_s = 0.0
        self.first_audio_phases = TimeCounts()  # FIRST_AUDIO_PHASES of streaming speech replies

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def voices(self) -> tuple[str, ...]:
        return self.adapter.voices if self.adapter is not None and self.supports_audio_output else ()

    @property
    def default_voice(self) -> str | None:
        return self.adapter.default_voice if self.adapter is not None else None

    async def start(self) -> None:
        from omni_runtime.models.registry import load_adapter  # torch and transformers: only now

        started = time.monotonic()
        adapter = await asyncio.to_thread(load_adapter, self.options, hosted=self.hosted)
        self.adapter = adapter
        self.model_name = self.options.model_name or adapter.model_name
        self.output_sample_rate = adapter.output_sample_rate
        self.thinker_hold_below_s = THINKER_HOLD_BELOW_S if adapter.vocoder_shares_thinker_device else None
        local = LocalStages(adapter, self.options, hosted=self.hosted)
        await local.start()
        if local.vocoder_worker is not None:  # far windows' calls bounded while a stream is near
            local.vocoder_worker.near = self.streams_near
        self.stages = await attach_remote_stages(local, self.options)
        self.encoders = MediaEncoders(self.stages, adapter, cache_bytes=self.options.encoder_cache_mb << 20)
        await local.warmup()
        await self._warm_requests()
        self.load_seconds = time.monotonic() - started
        self._ready = True
        log.info("engine ready: %s (%s pipeline) in %.1fs", self.model_name, self.variant, self.load_seconds)

    async def _warm_requests(self) -> None:
        """One short request per output kind, so the first client does not pay for lazy init; the
        text one also carries a second of audio, so the first spoken turn does not pay for the
        audio path's (a realtime session's first turn took 1.0 s to first audio on an H100, the
        next ones 0.5 s)."""
        from omni_runtime.contract.engine import ChatTurn, SamplingParams

        kinds = [False, True] if self.supports_audio_output else [False]
        # On a GPU, enough codes for every recurring vocoder window size (first, second, steady),
        # so each is captured as a CUDA graph before the first client; on a CPU a short reply will do.
        captures = self.adapter is not None and self.adapter.captures_cuda_graphs
        windows = self.adapter.codec_windows if self.adapter is not None else {}
        talker_tokens = CodecSegmenter(family_config(windows)).codes_to_cover() + 5 if captures else 24
        second = np.arange(16000, dtype=np.float32) / 16000
        heard = MediaInput(kind="audio", data=0.1 * np.sin(2 * np.pi * 440 * second), sample_rate=16000)

        def request(audio: bool, rid: str) -> GenerationRequest:
            return GenerationRequest(
                request_id=rid,
                turns=(ChatTurn(role="user", text="Hello.", media=() if audio else (heard,)),),
                sampling=SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True),
                want_audio=audio,
                stage_params={"talker": {"max_tokens": talker_tokens}},
            )

        async def drain(item: GenerationRequest) -> None:
            async for _ in self.generate(item):
                pass

        for audio in kinds:
            await drain(request(audio, f"warmup-{int(audio)}"))
        if captures:
            # Then a full batch at once: the first burst of clients met batch shapes, allocations
            # and admissions no single request makes (on an H200, Qwen3-Omni's first 16-stream
            # burst reached first audio in 0.64 s, the next ones in 0.42 s).
            await asyncio.gather(
                *(drain(request(kinds[-1], f"warmup-burst-{k}")) for k in range(self.options.max_batch_size))
            )

    async def stop(self) -> None:
        self._ready = False
        if self.encoders is not None:
            await self.encoders.stop()
        if self.stages is not None:
            await self.stages.stop()

    async def refresh_stats(self) -> None:
        """Ask the stage processes behind stage links for their counters (before a /metrics
        scrape): ``stats`` then reports every stage of the worker, wherever it runs."""
        if self.stages is None or not self.stages.stat_links:
            return
        self._remote_stats, failed = await self.stages.remote_stats()
        self._remote_stats_failures += failed

    def stats(self) -> EngineStats:
        cache = self.encoders.cache.counters() if self.encoders is not None else None
        prefetch = self.encoders.counters() if self.encoders is not None else None
        processes = (
            (self.stages.local.process_stats(), *self._remote_stats) if self.stages is not None else ()
        )
        kv = next((p.session_kv for p in processes if p.session_kv), {})
        talker_kv = next((p.talker_kv for p in processes if p.talker_kv), {})
        return EngineStats(
            queue_depth=sum(p.queue_depth for p in processes),
            running_batch=sum(p.running_batch for p in processes),
            max_running_batch=max((p.max_running_batch for p in processes), default=0),
            thinker_steps=sum(p.thinker_steps for p in processes),
            thinker_steps_ahead=sum(p.thinker_steps_ahead for p in processes),
            active_requests=self._active,
            stages=tuple(load for p in processes for load in p.stages),
            encoder_cache_hits=cache.hits if cache else 0,
            encoder_cache_misses=cache.misses if cache else 0,
            encoder_cache_evictions=cache.evictions if cache else 0,
            encoder_cache_bytes=cache.bytes if cache else 0,
            prefetch_submitted=prefetch.submitted if prefetch else 0,
            prefetch_done=prefetch.done if prefetch else 0,
            prefetch_failed=prefetch.failed if prefetch else 0,
            **_stats_fields("session_kv", kv),
            **_stats_fields("talker_kv", talker_kv),
            first_audio_phases=self.first_audio_phases.snapshot(),
            speech_replies=self._speech_replies,
            busy_first_windows=self._busy_first_windows,
            lingered_first_windows=self._lingered_first_windows,
            first_window_linger_seconds=self._first_window_linger_s,
            gpus=gpu_memory()
            if not processes
            else tuple(
                replace(gpu, process="" if i == 0 else p.process)
                for i, p in enumerate(processes)
                for gpu in p.gpus
            ),
            remote_stats_failures=self._remote_stats_failures,
        )

    def _session_vectors(self, request: GenerationRequest) -> bool:
        """A session's rows keep the talker's vectors on a worker that speaks, so the kept KV of
        a text turn (or a warm-up) also serves the session's next speech turn."""
        return request.session_key is not None and self.supports_audio_output

    async def warm_session(self, request: GenerationRequest) -> int:
        if self.stages is None or self.encoders is None:
            raise EngineError("the engine is still loading; retry when /ready says so", status=503)
        if request.session_key is None:
            raise EngineError("a warm-up needs the session's key", param="session_key")
        validate_request(request, engine=self)
        local = self.stages.local.thinker
        if local is not None and not local.kv.enabled:
            return 0  # nothing would be kept (--session-kv-mb 0, or a runner that keeps none)
        return await warm_prefix(
            request, stages=self.stages, encoders=self.encoders, want_vectors=self._session_vectors(request)
        )

    def end_session(self, session_key: str) -> None:
        if self.stages is not None:
            self.stages.thinker.end_session(session_key)
            talker = self.stages.talker
            if talker is not None:
                talker.end_session(session_key)

    def prefetch_media(self, media: Sequence[MediaInput], *, audio_prefix: bool = False) -> bool:
        if not self._ready or self.encoders is None:
            return False
        return self.encoders.prefetch(media, audio_prefix=audio_prefix)

    @property
    def audio_chunk_samples(self) -> int | None:
        frames = self.adapter.audio_chunk_frames if self.adapter is not None else None
        if not frames or self.encoders is None or not self.encoders.cache.enabled:
            return None
        return frames * HOP_SAMPLES

    # -- one request ------------------------------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        if self.stages is None or self.adapter is None:
            raise EngineError("the engine is still loading; retry when /ready says so", status=503)
        voice = validate_request(request, engine=self)
        self._active += 1
        out: asyncio.Queue[EngineEvent] = asyncio.Queue()
        state: dict[str, Any] = {}
        producer = asyncio.get_running_loop().create_task(self._produce(request, voice, out, state))
        try:
            while True:
                event = await out.get()
                if isinstance(event, EngineError):
                    raise event
                yield event
                if isinstance(event, Finished):
                    return
        finally:
            self._active -= 1
            producer.cancel()
            self._release(state, "cancelled")

    def _release(self, state: dict[str, Any], reason: FinishReason) -> None:
        for task in state.get("tasks", []):
            task.cancel()
        if self.stages is None:
            return
        if (job := state.get("thinker_job")) is not None and job.finish is None:
            self.stages.thinker.finish(job, reason)
        if (tjob := state.get("talker_job")) is not None:
            self._talkers_on_text.discard(tjob.request_id)
            if tjob.finish is None:
                self._talker().finish(tjob, reason)

    def _talker(self) -> TalkerService:
        assert self.stages is not None
        if self.stages.talker is None:
            raise EngineError("this worker hosts no talker and names none in remote_stages", status=500)
        return self.stages.talker

    async def _produce(
        self, request: GenerationRequest, voice: str | None, out: asyncio.Queue, state: dict
    ) -> None:
        try:
            await self._run(request, voice, out, state)
        except EngineError as exc:
            out.put_nowait(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("request %s failed", request.request_id)
            out.put_nowait(Finished("error", error=f"{type(exc).__name__}: {exc}"))

    async def _run(
        self, request: GenerationRequest, voice: str | None, out: asyncio.Queue, state: dict
    ) -> None:
        marks = FirstAudioMarks(accepted=time.monotonic())
        counted = int(request.want_audio and request.stream_audio and self.variant in STREAMING_AUDIO)
        self._speech_replies += counted
        try:
            await self._run_accepted(request, voice, out, state, marks)
        finally:  # ended, failed or cancelled
            self._speech_replies -= counted

    async def _run_accepted(
        self,
        request: GenerationRequest,
        voice: str | None,
        out: asyncio.Queue,
        state: dict,
        marks: FirstAudioMarks,
    ) -> None:
        stages, adapter, encoders = self.stages, self.adapter, self.encoders
        assert stages is not None and adapter is not None and encoders is not None  # generate() checked
        stages.local.prompting += 1  # a local thinker may hold a burst's first prompts for this one
        try:
            prompt = await stages.preprocess(request)
            audio, image, video = await encoders.encode(prompt)
            thinker_prompt = await stages.aggregate(prompt, audio=audio, image=image, video=video)
        finally:
            stages.local.prompting -= 1
        sp = request.sampling
        job = ThinkerJob(
            request_id=request.request_id,
            prompt=thinker_prompt,
            sampling=row_sampling(sp),
            max_tokens=sp.max_tokens,
            ignore_eos=sp.ignore_eos,
            want_vectors=request.want_audio or self._session_vectors(request),
            session=request.session_key,
        )
        state["thinker_job"] = job
        stages.thinker.submit(job)
        marks.submitted = time.monotonic()
        detok = IncrementalDetokenizer(adapter.tokenizer)
        stops = StopMatcher(sp.stop)
        eos = frozenset(adapter.eos_token_ids)
        talker_job: TalkerJob | None = None
        speaker: asyncio.Task | None = None
        prompt_vectors = None
        first_token = -1
        generated = 0
        pending_ids: list[int] = []
        reason: FinishReason = "stop"
        while True:
            event = await job.events.get()
            if isinstance(event, tuple):  # ("prompt_vectors", tensor) before the first token
                prompt_vectors = event[1]
                continue
            if isinstance(event, ThinkerDone):
                if event.reason == "error":
                    raise RuntimeError(event.error or "thinker failed")
                reason = event.reason
                tail = stops.feed(detok.flush()) + stops.flush()
                if tail:
                    out.put_nowait(TextDelta(tail, tuple(pending_ids)))
                break
            assert isinstance(event, ThinkerToken)
            generated += 1
            if request.want_audio:
                if generated == 1:
                    first_token = event.token
                    marks.first_token = time.monotonic()
                elif generated == 2 and prompt_vectors is not None:
                    talker_job = self._talker_job(
                        request, thinker_prompt, prompt_vectors, first_token, event.vector, voice, job.reused
                    )
                    state["talker_job"] = talker_job
                    self._talkers_on_text.add(request.request_id)
                    tasks = state.setdefault("tasks", [])  # the release cancels every one
                    speaker = asyncio.get_running_loop().create_task(
                        self._speak(request, talker_job, voice, out, marks, tasks=tasks)
                    )
                    tasks.append(speaker)
                elif talker_job is not None:
                    self._talker().feed(talker_job, event.vector)
            if event.token in eos and not sp.ignore_eos:
                continue
            pending_ids.append(event.token)
            text = stops.feed(detok.push(event.token))
            if text:
                out.put_nowait(TextDelta(text, tuple(pending_ids)))
                pending_ids = []
            if stops.stopped:
                stages.thinker.finish(job, "stop")
                reason = "stop"
                break
        if talker_job is not None:
            self._talkers_on_text.discard(request.request_id)
            self._talker().text_finished(talker_job, generated)
        audio_seconds = await speaker if speaker is not None else 0.0
        usage = Usage(
            prompt_tokens=len(thinker_prompt.input_ids),
            completion_tokens=generated,
            audio_seconds=audio_seconds,
            cached_tokens=job.reused,
        )
        out.put_nowait(Finished(reason, usage))

    def streams_near(self, within_s: float) -> bool:
        """Whether a streaming speech reply has less than ``within_s`` of audio left at its
        listener, or none yet (deadlines.near_streams)."""
        now = time.monotonic()
        slacks = [clock.slack(now=now) for clock in self._play_heads.values()]
        return bool(self._before_first_audio) or near_streams(slacks, within_s=within_s)

    def _window_hold(self, slack_s: float | None, request_id: str) -> AbstractAsyncContextManager[None]:
        """Hold the thinker while a window with this slack is synthesised (deadlines.holds_thinker).

        Another reply still before its first audio, or a prompt waiting for the thinker, counts as
        pending; this reply's own first window (a later window can be cut while it is still at the
        vocoder) does not: that window holds the thinker itself."""
        if self.stages is None:
            return contextlib.nullcontext()
        thinker = self.stages.thinker
        pending = thinker.waiting_count > 0 or bool(self._before_first_audio - {request_id})
        text = self.holds_spare_text and bool(self._talkers_on_text - {request_id})
        if not holds_thinker(
            slack_s=slack_s, below_s=self.thinker_hold_below_s, first_audio_pending=pending, text_pending=text
        ):
            return contextlib.nullcontext()
        return thinker.hold()

    def _talker_job(
        self,
        request: GenerationRequest,
        thinker_prompt: ThinkerPrompt,
        prompt_vectors: Any,
        first_token: int,
        first_vector: Any,
        voice: str | None,
        reused: int = 0,
    ) -> TalkerJob:
        limits = talker_limits(request)
        assert self.adapter is not None
        params = talker_sampling(request, self.adapter.talker_sampling_defaults())
        seed = request.sampling.seed
        admission = TalkerAdmission(
            slot=-1,
            input_ids=thinker_prompt.input_ids,
            talker_context=thinker_prompt.talker_context,
            prompt_vectors=prompt_vectors,
            first_token=first_token,
            first_vector=first_vector,
            voice=voice or "",
            sampling=RowSampling(
                temperature=float(params.get("temperature", 0.9)),
                top_k=int(params.get("top_k", 40)),
                top_p=float(params.get("top_p", 0.8)),
                repetition_penalty=float(params.get("repetition_penalty", 1.05)),
                seed=None if seed is None else seed + 7919,
            ),
            ignore_eos=limits.ignore_eos,
        )
        job = TalkerJob(
            admission=admission,
            request_id=request.request_id,
            max_codes=limits.max_codes,
            codes_per_text_token=limits.per_text_token,
            session=request.session_key,
            prefix_limit=reused,  # the thinker's kept prefix: the talker's vectors there are kept ones
        )
        self._talker().submit(job)
        return job

    async def _speak(
        self,
        request: GenerationRequest,
        job: TalkerJob,
        voice: str | None,
        out: asyncio.Queue,
        marks: FirstAudioMarks | None = None,
        tasks: list[asyncio.Future] | None = None,
    ) -> float:
        """Talker codes -> segmenter windows -> vocoder -> audio chunks; returns seconds of audio.

        Streaming sends each window as soon as its codes exist; otherwise the same windows are cut
        once the talker ends and synthesised together (one chunk). Either way each window is its
        own vocoder item, so cancelling this task drops every window not yet running. Each window's
        call also goes into ``tasks`` (the request's tasks, which its release cancels at once):
        cancelling this task alone lets a window queued at the vocoder start a call before this
        task runs its cleanup.
        """
        streaming = self.variant in STREAMING_AUDIO and request.stream_audio
        assert self.adapter is not None
        segmenter = CodecSegmenter(family_config(self.adapter.codec_windows, at_end=not streaming))
        seed = (
            request.sampling.seed if request.sampling.seed is not None else hash(request.request_id) & 0xFFFF
        )
        if not streaming:
            return await self._speak_at_end(job, voice, out, segmenter, seed, tasks)
        self._before_first_audio.add(request.request_id)
        try:
            return await self._stream_windows(request, job, voice, out, segmenter, seed, marks, tasks)
        finally:  # ended, failed or cancelled, before its first audio or after
            self._before_first_audio.discard(request.request_id)

    async def _speak_at_end(
        self,
        job: TalkerJob,
        voice: str | None,
        out: asyncio.Queue,
        segmenter: CodecSegmenter,
        seed: int,
        tasks: list[asyncio.Future] | None = None,
    ) -> float:
        """Non-streaming: the windows, cut once the talker ends, synthesised together (one chunk)."""
        standard = segmenter.recurring_sizes()
        codes: list[Any] = []  # codec tokens, or frames (a tuple of codes per codebook)
        samples = 0
        assert self.stages is not None
        done = False
        while not done:
            done = _take_codes([await job.events.get()], job, codes)
            # all at once: the smallest size that fits, which the reply's own second window may share
            windows = [widen_to_recurring(w, standard) for w in segmenter.push(len(codes), done=done)]
            if not windows:
                continue
            items = [window_item(codes, w, voice=voice, seed=seed, sizes=standard) for w in windows]
            calls = [asyncio.ensure_future(self.stages.synthesize(item)) for item in items]
            if tasks is not None:
                tasks.extend(calls)
            try:
                pieces = await asyncio.gather(*calls)
            finally:  # one failed window (or a cancel) drops the rest still queued
                for call in calls:
                    call.cancel()
            pcm = np.concatenate([np.asarray(p, dtype=np.float32) for p in pieces])
            samples += len(pcm)
            out.put_nowait(AudioChunk(pcm=pcm, sample_rate=self.output_sample_rate))
        return samples / self.output_sample_rate

    async def _stream_windows(
        self,
        request: GenerationRequest,
        job: TalkerJob,
        voice: str | None,
        out: asyncio.Queue,
        segmenter: CodecSegmenter,
        seed: int,
        marks: FirstAudioMarks | None,
        tasks: list[asyncio.Future] | None = None,
    ) -> float:
        """Streaming: each window is cut over the codes that exist when it is cut (the talker kept
        going while the last one was synthesised: a catch-up window), up to ``windows_ahead`` of
        them at the vocoder at once, and their audio goes out in order.

        With one window at a time, a reply's second window was asked only once its first came
        back, and at 16 streams its round trip (the vocoder call in flight, then its own) outlasted
        the first window's 0.2 s of audio: the listener stalled there. A window cut while earlier
        ones are still at the vocoder carries the slack it will have once they are sent
        (`deadlines.ahead_slack`), so it never goes before a stream that runs dry sooner."""
        assert self.stages is not None and self.adapter is not None
        standard = segmenter.recurring_sizes()
        code_seconds = 1.0 / self.adapter.codes_per_second
        clock = PlaybackClock()  # the listener's play head: orders this stream's windows (deadlines)
        codes: list[Any] = []
        samples = 0
        done = False
        ahead: deque[tuple[float, asyncio.Future]] = deque()  # (seconds of audio, its synthesis)

        def wake(_: asyncio.Future) -> None:
            # A window ended: wake the loop below through the talker's queue, with no codes.
            job.events.put_nowait([])

        rid = request.request_id
        self._play_heads[rid] = clock
        try:
            while True:
                need = segmenter.codes_until_first(len(codes), streams=self._speech_replies)
                if need is not None:
                    self._first_window_need[rid] = need
                while len(ahead) < max(1, self.windows_ahead) and (
                    ready := segmenter.push(len(codes), done=done, limit=1, streams=self._speech_replies)
                ):
                    if ready[0].start == 0:
                        if segmenter.first_busy:
                            self._busy_first_windows += 1
                        if marks is not None:  # cut: a wait for other replies' counts as its line
                            marks.window_asked = time.monotonic()
                        self._first_window_gone(rid, ended=False)
                        await self._linger_first(rid)
                    window = widen_to_recurring(ready[0], standard, prefer=segmenter.busy_size)
                    queued = sum(seconds for seconds, _ in ahead)
                    slack = ahead_slack(clock.slack(now=time.monotonic()), queued)
                    item = window_item(codes, window, voice=voice, seed=seed, sizes=standard, slack_s=slack)
                    seconds = (window.end - window.start) * code_seconds
                    call = asyncio.ensure_future(self._synthesize_held(item, slack, request))
                    call.add_done_callback(wake)
                    if tasks is not None:
                        tasks.append(call)
                    ahead.append((seconds, call))
                if done and not ahead:
                    return samples / self.output_sample_rate
                # One plain wait per code (a Task and asyncio.wait per code cost three times as much
                # of the loop at 32 streams): a window's end puts an empty code list on the same queue.
                if done:
                    await asyncio.wait({ahead[0][1]})
                else:
                    done = _take_codes([await job.events.get()], job, codes)
                while ahead and ahead[0][1].done():
                    pcm = ahead.popleft()[1].result()
                    samples += len(pcm)
                    out.put_nowait(AudioChunk(pcm=pcm, sample_rate=self.output_sample_rate))
                    if clock.ends_at is None:  # this stream's first audio
                        self._before_first_audio.discard(request.request_id)
                        if marks is not None:
                            marks.record(self.first_audio_phases, audio=time.monotonic())
                    clock.sent(now=time.monotonic(), seconds=len(pcm) / self.output_sample_rate)
                if marks is not None and codes and marks.first_code is None:
                    marks.first_code = time.monotonic()
        finally:  # a failed window or a cancel drops the windows still at the vocoder
            self._play_heads.pop(rid, None)
            self._first_window_gone(rid, ended=True)
            for _, pending in ahead:
                if pending.done() and not pending.cancelled():
                    pending.exception()  # retrieved: a later window's failure is not logged as unhandled
                pending.cancel()

    def _first_window_gone(self, request_id: str, *, ended: bool) -> None:
        """This reply's first window was cut, or the reply ``ended`` before it was: it is no
        longer one to wait for. One that ended wakes the first windows waiting (they go: the
        company they waited for may have been this one)."""
        if self._first_window_need.pop(request_id, None) is not None and ended:
            self._release_first_windows()

    def _release_first_windows(self) -> None:
        """Every first window waiting goes now. They wake before the window of the reply that
        releases them reaches the vocoder's line (its call is a task that runs after them), so
        all of them are queued when the vocoder takes its next batch."""
        for wake in self._first_window_waiters:
            wake.set()

    async def _linger_first(self, request_id: str) -> None:
        """Before a reply's first window goes to the vocoder (`deadlines.lingers`): with another
        first window already waiting, this one is the company it waited for, and both go now;
        otherwise, while another reply's first window is a few codes from being cut, wait until
        the next first window goes (or ``first_linger_s``), then go with it. The codes this reply's
        talker makes meanwhile wait in its queue.

        Waiting for one next window, not for every near one, keeps a wave whose replies arrived a
        few milliseconds apart from chaining: the first ready would otherwise wait out its bound
        while the ones it waited for went ahead of it."""
        if self.stages is None or Stage.talker in self.stages.linked:
            # The vocoder is behind a stage link: each window is its own message there, and the
            # remote worker may start on the first before the second arrives (not measured).
            return
        began = time.monotonic()
        others = (need for rid, need in self._first_window_need.items() if rid != request_id)
        if lingers(others, within=self.first_linger_codes, waiting=bool(self._first_window_waiters)):
            # A plain event, set by the next first window to go or by the timer: one wake-up, so
            # this window is queued right after that one (asyncio.wait_for would add a task
            # between them on Python 3.11, and the vocoder could start without it).
            wake = asyncio.Event()
            self._first_window_waiters.add(wake)
            timer = asyncio.get_running_loop().call_later(self.first_linger_s, wake.set)
            try:
                await wake.wait()
            finally:
                timer.cancel()
                self._first_window_waiters.discard(wake)
            self._lingered_first_windows += 1
            self._first_window_linger_s += time.monotonic() - began
        self._release_first_windows()

    async def _synthesize_held(
        self, item: dict[str, Any], slack: float | None, request: GenerationRequest
    ) -> Any:
        assert self.stages is not None
        async with self._window_hold(slack, request.request_id):
            return await self.stages.synthesize(item)


def _take_codes(events: list[Any], job: TalkerJob, codes: list[Any]) -> bool:
    """Append ``events`` and every talker event already queued to ``codes``; True once the talker
    is done. A failed talker raises."""
    while not job.events.empty():
        events.append(job.events.get_nowait())
    done = False
    for event in events:
        if isinstance(event, TalkerDone):
            done = True
            if event.reason == "error":
                raise RuntimeError(event.error or "talker failed")
        else:
            codes.extend(event)
    return done


@dataclass
class FirstAudioMarks:
    """When a streaming speech reply passed each step on its way to first audio (monotonic)."""

    accepted: float
    submitted: float | None = None
    first_token: float | None = None
    first_code: float | None = None
    window_asked: float | None = None

    def record(self, phases: TimeCounts, *, audio: float) -> None:
        """Each FIRST_AUDIO_PHASES duration into ``phases``, once the first audio is out."""
        ends = (self.submitted, self.first_token, self.first_code, self.window_asked, audio)
        if any(end is None for end in ends):
            return  # a path that skipped a step (no talker code before a window): nothing to split
        begin = self.accepted
        for phase, end in zip(FIRST_AUDIO_PHASES, ends, strict=True):
            assert end is not None
            phases.observe(phase, max(end - begin, 0.0))
            begin = end
