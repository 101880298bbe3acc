"""Stages in another process, reached through a stage link (the client side of stage_server.py).

``LinkedStages`` offers the stage calls of ``service.StageCalls`` over one link; ``RemoteThinker``
and ``RemoteTalker`` stand in for the local schedulers (``service.ThinkerService`` /
``TalkerService``) by turning the link's reply stream into the same job events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from omni_runtime.contract.adapter import Prompt, ThinkerPrompt
from omni_runtime.contract.engine import EngineError, GenerationRequest, ProcessStats
from omni_runtime.pipeline import wire
from omni_runtime.pipeline.link.client import StageLinkClient
from omni_runtime.pipeline.link.frames import LinkError, Reply, Tensors
from omni_runtime.pipeline.scheduler import FinishReason, ThinkerDone, ThinkerJob, ThinkerToken
from omni_runtime.pipeline.talker import TalkerDone, TalkerJob

log = logging.getLogger(__name__)
READY_TIMEOUT_S = 1800.0  # a remote stage may be loading a large checkpoint
STATS_TIMEOUT_S = 2.0  # a /metrics scrape waits this long at most for a stage process's counters


def end_remote_session(
    client: StageLinkClient, stage: str, session: str, pending: set[asyncio.Task[None]]
) -> None:
    """Tell a stage process to forget a session's kept KV (``<stage>.end_session``), in the
    background; ``pending`` holds the task until it is done (tests await them)."""

    async def end() -> None:
        try:
            await client.call_once(f"{stage}.end_session", {"session": session}, {})
        except LinkError as exc:  # the remote store evicts it under pressure anyway
            log.info("remote %s kept session %s: %s", stage, session, exc)

    task = asyncio.get_running_loop().create_task(end())
    pending.add(task)
    task.add_done_callback(pending.discard)


class RemoteThinker:
    def __init__(self, client: StageLinkClient) -> None:
        self.client = client
        self._tasks: dict[ThinkerJob, asyncio.Task[None]] = {}
        self._ending: set[asyncio.Task[None]] = set()

    def submit(self, job: ThinkerJob) -> None:
        self._tasks[job] = asyncio.get_running_loop().create_task(self._pump(job))

    def finish(self, job: ThinkerJob, reason: FinishReason) -> None:
        if job.finish is not None:
            return
        job.finish = reason
        job.events.put_nowait(ThinkerDone(reason))
        task = self._tasks.pop(job, None)
        if task is not None:
            task.cancel()  # closes the call: the remote scheduler frees the slot

    def end_session(self, session: str) -> None:
        end_remote_session(self.client, "thinker", session, self._ending)

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        yield  # the remote thinker does not share this process's device

    @property
    def waiting_count(self) -> int:
        return 0  # nothing here is held for it (hold): its line is the remote process's business

    async def _pump(self, job: ThinkerJob) -> None:
        payload, tensors = wire.pack_thinker_prompt(job.prompt)
        call = {
            "request_id": job.request_id,
            "prompt": payload,
            "sampling": wire.pack_sampling(job.sampling),
            "max_tokens": job.max_tokens,
            "ignore_eos": job.ignore_eos,
            "want_vectors": job.want_vectors,
            "session": job.session,
        }
        try:
            async with contextlib.aclosing(self.client.call("thinker.generate", call, tensors)) as replies:
                async for reply, data in replies:
                    kind = reply["type"]
                    if kind == "prompt_vectors":
                        job.events.put_nowait(("prompt_vectors", data["vectors"]))
                    elif kind == "token":
                        job.reused = int(reply.get("reused", 0))
                        job.events.put_nowait(ThinkerToken(int(reply["token"]), data.get("vector")))
                    elif job.finish is None:
                        job.finish = reply["reason"]
                        job.events.put_nowait(ThinkerDone(reply["reason"], reply.get("error")))
        except LinkError as exc:
            if job.finish is None:
                job.finish = "error"
                job.events.put_nowait(ThinkerDone("error", f"remote thinker: {exc}"))
        finally:
            self._tasks.pop(job, None)


class RemoteTalker:
    def __init__(self, client: StageLinkClient) -> None:
        self.client = client
        self._tasks: dict[TalkerJob, list[asyncio.Task[None]]] = {}
        self._feeds: dict[TalkerJob, asyncio.Queue[tuple[Any, int | None]]] = {}
        self._ending: set[asyncio.Task[None]] = set()

    def submit(self, job: TalkerJob) -> None:
        loop = asyncio.get_running_loop()
        self._feeds[job] = asyncio.Queue()
        self._tasks[job] = [loop.create_task(self._pump(job)), loop.create_task(self._feeder(job))]

    def feed(self, job: TalkerJob, vector: Any) -> None:
        self._feeds[job].put_nowait((vector, None))

    def text_finished(self, job: TalkerJob, text_tokens: int) -> None:
        self._feeds[job].put_nowait((None, text_tokens))

    def finish(self, job: TalkerJob, reason: FinishReason) -> None:
        if job.finish is None:
            job.finish = reason
            job.events.put_nowait(TalkerDone(reason))
        for task in self._tasks.pop(job, []):
            task.cancel()
        self._feeds.pop(job, None)

    def end_session(self, session: str) -> None:
        end_remote_session(self.client, "talker", session, self._ending)

    async def _feeder(self, job: TalkerJob) -> None:
        queue = self._feeds[job]
        while True:
            items = [await queue.get()]
            while not queue.empty():
                items.append(queue.get_nowait())
            vectors = [v for v, _ in items if v is not None]
            text_done = next((n for _, n in items if n is not None), None)
            tensors: dict[str, Any] = {}
            if vectors:
                import torch

                tensors["vectors"] = torch.stack([v.to("cpu") for v in vectors])
            payload = {"request_id": job.request_id, "text_done": text_done}
            await self.client.call_once("talker.feed", payload, tensors)
            if text_done is not None:
                return

    async def _pump(self, job: TalkerJob) -> None:
        payload, tensors = wire.pack_talker_admission(job.admission)
        call = {
            "request_id": job.request_id,
            "admission": payload,
            "max_codes": job.max_codes,
            "codes_per_text_token": job.codes_per_text_token,
            "session": job.session,  # conversation KV: the talker process keeps the session's prompt KV
            "prefix_limit": job.prefix_limit,
        }
        try:
            async with contextlib.aclosing(self.client.call("talker.generate", call, tensors)) as replies:
                async for reply, _ in replies:
                    if reply["type"] == "codes":
                        job.events.put_nowait(list(reply["codes"]))
                    elif job.finish is None:
                        job.finish = reply["reason"]
                        job.events.put_nowait(TalkerDone(reply["reason"], reply.get("error")))
        except LinkError as exc:
            if job.finish is None:
                job.finish = "error"
                job.events.put_nowait(TalkerDone("error", f"remote talker: {exc}"))


class LinkedStages:
    """The stage calls (``service.StageCalls``) of the stages one stage link serves."""

    def __init__(self, client: StageLinkClient) -> None:
        self.client = client
        self.address = client.address
        self.thinker = RemoteThinker(client)
        self.talker = RemoteTalker(client)

    @classmethod
    def connect(cls, address: str) -> LinkedStages:
        return cls(StageLinkClient(address, connect_timeout=READY_TIMEOUT_S))

    async def wait_ready(self) -> None:
        """Until the stage process reports ready (loaded and warmed up), for READY_TIMEOUT_S at most."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_TIMEOUT_S
        while True:
            try:
                health = await self.client.health(timeout=10.0)
                if health.get("ready"):
                    return
            except (LinkError, TimeoutError) as exc:
                log.info("waiting for stage link %s: %s", self.address, exc)
            if loop.time() > deadline:
                raise EngineError(
                    f"remote stage at {self.address} was not ready within {READY_TIMEOUT_S:g}s", status=503
                )
            await asyncio.sleep(0.5)

    async def close(self) -> None:
        await self.client.close()

    async def stats(self) -> ProcessStats | None:
        """The stage process's counters (``stats.get``); None when it does not answer in time."""
        try:
            reply, _ = await asyncio.wait_for(self.client.call_once("stats.get", {}, {}), STATS_TIMEOUT_S)
        except (LinkError, TimeoutError) as exc:
            log.warning("stage process at %s sent no stats: %s", self.address, exc)
            return None
        return wire.unpack_process_stats(reply)

    async def preprocess(self, request: GenerationRequest) -> Prompt:
        payload, tensors = wire.pack_request(request)
        reply, data = await self._call("preprocessing", "preprocessing.run", payload, tensors)
        return wire.unpack_prompt(reply, data)

    async def encode_audio(self, audio: dict[str, Any]) -> Any:
        _, data = await self._call("audio_encoder", "audio_encoder.encode", {}, audio)
        return data["embeds"]

    async def encode_vision(self, vision: dict[str, Any]) -> dict[str, Any]:
        _, data = await self._call("image_encoder", "image_encoder.encode", {}, vision)
        return {"image": data.get("image"), "video": data.get("video")}

    async def aggregate(self, prompt: Prompt, *, audio: Any, image: Any, video: Any) -> ThinkerPrompt:
        payload, tensors = wire.pack_prompt(prompt)
        for name, value in (("audio", audio), ("image", image), ("video", video)):
            if value is not None:
                tensors[f"emb.{name}"] = value
        reply, data = await self._call("mm_aggregate", "mm_aggregate.run", payload, tensors)
        return wire.unpack_thinker_prompt(reply, data)

    async def synthesize(self, item: dict[str, Any]) -> Any:
        _, data = await self._call("talker", "talker_stream.synthesize", item, {})
        return data["pcm"]

    async def _call(self, stage: str, method: str, payload: dict[str, Any], tensors: Tensors) -> Reply:
        try:
            return await self.client.call_once(method, payload, tensors)
        except LinkError as exc:
            raise EngineError(f"stage {stage} ({self.address}) failed: {exc}", status=502) from exc
