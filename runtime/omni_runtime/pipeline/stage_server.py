"""The server side of remote stages: stage-link handlers over this process's LocalStages.

Method names are ``<stage>.<call>``, and ``stats.get`` (every stage process: its counters, which
the worker's /metrics merges). Streaming calls (``thinker.generate``, ``talker.generate``)
reply once per token or code batch; the client closing the call cancels the request here, which
frees its slot just as closing ``Engine.generate`` does in-process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from omni_runtime.pipeline import wire
from omni_runtime.pipeline.scheduler import ThinkerDone, ThinkerJob, ThinkerToken
from omni_runtime.pipeline.services import LocalStages
from omni_runtime.pipeline.talker import TalkerDone, TalkerJob

Reply = tuple[dict[str, Any], dict[str, Any]]


class StageHandlers:
    def __init__(self, local: LocalStages) -> None:
        self.local = local
        self._talker_jobs: dict[str, TalkerJob] = {}
        self._early_feeds: dict[str, list[tuple[Any, int | None]]] = {}

    def handlers(self) -> dict[str, Any]:
        hosted = self.local.hosted
        table: dict[str, Any] = {"stats.get": self.stats}
        if "preprocessing" in hosted:
            table["preprocessing.run"] = self.preprocess
        if "audio_encoder" in hosted:
            table["audio_encoder.encode"] = self.encode_audio
        if "image_encoder" in hosted:
            table["image_encoder.encode"] = self.encode_vision
        if "mm_aggregate" in hosted:
            table["mm_aggregate.run"] = self.aggregate
        if "thinker" in hosted:
            table["thinker.generate"] = self.thinker_generate
            table["thinker.end_session"] = self.thinker_end_session
        if "talker" in hosted:
            table["talker.generate"] = self.talker_generate
            table["talker.feed"] = self.talker_feed
            table["talker.end_session"] = self.talker_end_session
            table["talker_stream.synthesize"] = self.synthesize
        return table

    async def stats(self, payload: dict[str, Any], tensors: dict[str, Any]) -> Reply:
        return wire.pack_process_stats(self.local.process_stats()), {}

    async def preprocess(self, payload: dict[str, Any], tensors: dict[str, Any]) -> Reply:
        prompt = await self.local.preprocess(wire.unpack_request(payload, tensors))
        return wire.pack_prompt(prompt)

    async def encode_audio(self, payload: dict[str, Any], tensors: dict[str, Any]) -> Reply:
        return {}, {"embeds": await self.local.encode_audio(tensors)}

    async def encode_vision(self, payload: dict[str, Any], tensors: dict[str, Any]) -> Reply:
        result = await self.local.encode_vision(tensors)
        return {}, {k: v for k, v in result.items() if v is not None}

    async def aggregate(self, payload: dict[str, Any], tensors: dict[str, Any]) -> Reply:
        prompt = wire.unpack_prompt(payload, {k: v for k, v in tensors.items() if not k.startswith("emb.")})
        emb = {k[4:]: v for k, v in tensors.items() if k.startswith("emb.")}
        result = await self.local.aggregate(
            prompt, audio=emb.get("audio"), image=emb.get("image"), video=emb.get("video")
        )
        return wire.pack_thinker_prompt(result)

    async def thinker_generate(
        self, payload: dict[str, Any], tensors: dict[str, Any]
    ) -> AsyncIterator[Reply]:
        scheduler = self.local.thinker
        assert scheduler is not None
        job = ThinkerJob(
            request_id=str(payload["request_id"]),
            prompt=wire.unpack_thinker_prompt(payload["prompt"], tensors),
            sampling=wire.unpack_sampling(payload["sampling"]),
            max_tokens=int(payload["max_tokens"]),
            ignore_eos=bool(payload["ignore_eos"]),
            want_vectors=bool(payload["want_vectors"]),
            session=None if payload.get("session") is None else str(payload["session"]),
        )
        scheduler.submit(job)
        try:
            while True:
                event = await job.events.get()
                if isinstance(event, tuple):
                    yield {"type": "prompt_vectors"}, {"vectors": event[1]}
                elif isinstance(event, ThinkerToken):
                    extra = {"vector": event.vector} if event.vector is not None else {}
                    yield {"type": "token", "token": event.token, "reused": job.reused}, extra
                elif isinstance(event, ThinkerDone):
                    yield {"type": "done", "reason": event.reason, "error": event.error}, {}
                    return
        finally:
            if job.finish is None:
                scheduler.finish(job, "cancelled")

    async def thinker_end_session(self, payload: dict[str, Any], tensors: dict[str, Any]) -> Reply:
        assert self.local.thinker is not None
        self.local.thinker.end_session(str(payload["session"]))
        return {}, {}

    async def talker_end_session(self, payload: dict[str, Any], tensors: dict[str, Any]) -> Reply:
        assert self.local.talker is not None
        self.local.talker.end_session(str(payload["session"]))
        return {}, {}

    async def talker_generate(self, payload: dict[str, Any], tensors: dict[str, Any]) -> AsyncIterator[Reply]:
        scheduler = self.local.talker
        assert scheduler is not None
        request_id = str(payload["request_id"])
        job = TalkerJob(
            admission=wire.unpack_talker_admission(payload["admission"], tensors),
            request_id=request_id,
            max_codes=int(payload["max_codes"]),
            codes_per_text_token=int(payload["codes_per_text_token"]),
            session=None if payload.get("session") is None else str(payload["session"]),
            prefix_limit=int(payload.get("prefix_limit") or 0),
        )
        self._talker_jobs[request_id] = job
        for vector, text_done in self._early_feeds.pop(request_id, []):
            self._apply_feed(job, vector, text_done)
        scheduler.submit(job)
        try:
            while True:
                first = await job.events.get()
                batch = [first]
                while not job.events.empty():
                    batch.append(job.events.get_nowait())
                codes = [c for item in batch if isinstance(item, list) for c in item]
                done = next((item for item in batch if isinstance(item, TalkerDone)), None)
                if codes:
                    yield {"type": "codes", "codes": codes}, {}
                if done is not None:
                    yield {"type": "done", "reason": done.reason, "error": done.error}, {}
                    return
        finally:
            self._talker_jobs.pop(request_id, None)
            if job.finish is None:
                scheduler.finish(job, "cancelled")

    def _apply_feed(self, job: TalkerJob, vectors: Any, text_done: int | None) -> None:
        scheduler = self.local.talker
        assert scheduler is not None
        if vectors is not None:
            for row in vectors:
                scheduler.feed(job, row)
        if text_done is not None:
            scheduler.text_finished(job, text_done)

    async def talker_feed(self, payload: dict[str, Any], tensors: dict[str, Any]) -> Reply:
        request_id = str(payload["request_id"])
        text_done = payload.get("text_done")
        vectors = tensors.get("vectors")
        job = self._talker_jobs.get(request_id)
        if job is None:  # the feed overtook its generate call: keep it for the job
            self._early_feeds.setdefault(request_id, []).append((vectors, text_done))
        else:
            self._apply_feed(job, vectors, text_done)
        return {}, {}

    async def synthesize(self, payload: dict[str, Any], tensors: dict[str, Any]) -> Reply:
        pcm = await self.local.synthesize(
            {
                "codes": payload["codes"],
                "window": payload["window"],
                "voice": payload["voice"],
                "seed": payload["seed"],
                "reusable": bool(payload.get("reusable", False)),
                "slack_s": payload.get("slack_s"),  # relative: no clock is shared across processes
            }
        )
        return {}, {"pcm": np.asarray(pcm, dtype=np.float32)}
