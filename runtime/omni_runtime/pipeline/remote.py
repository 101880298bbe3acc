"""The client side of remote stages, and the stage set the engine talks to.

``StageSet`` offers one method per stage call and routes each to this process's LocalStages or
to a stage link, so the orchestration in engine.py is the same code in both cases. Remote thinker
and talker objects mimic the local schedulers' interface (submit / finish / feed) by turning the
link's reply stream into the same job events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from omni_runtime.contract.adapter import Prompt, ThinkerPrompt
from omni_runtime.contract.engine import EngineError, GenerationRequest
from omni_runtime.contract.options import EngineOptions
from omni_runtime.pipeline import wire
from omni_runtime.pipeline.link.client import StageLinkClient
from omni_runtime.pipeline.link.frames import LinkError
from omni_runtime.pipeline.scheduler import ThinkerDone, ThinkerJob, ThinkerToken
from omni_runtime.pipeline.services import LocalStages
from omni_runtime.pipeline.talker import TalkerDone, TalkerJob

log = logging.getLogger(__name__)
READY_TIMEOUT_S = 1800.0  # a remote stage may be loading a large checkpoint


class RemoteThinker:
    def __init__(self, client: StageLinkClient) -> None:
        self.client = client
        self.running_count = 0
        self.max_running_batch = 0
        self.waiting: tuple[ThinkerJob, ...] = ()
        self._tasks: dict[ThinkerJob, asyncio.Task[None]] = {}

    def submit(self, job: ThinkerJob) -> None:
        self._tasks[job] = asyncio.get_running_loop().create_task(self._pump(job))

    def finish(self, job: ThinkerJob, reason: str) -> None:
        if job.finish is not None:
            return
        job.finish = reason  # type: ignore[assignment]
        job.events.put_nowait(ThinkerDone(reason))  # type: ignore[arg-type]
        task = self._tasks.pop(job, None)
        if task is not None:
            task.cancel()  # closes the call: the remote scheduler frees the slot

    async def _pump(self, job: ThinkerJob) -> None:
        payload, tensors = wire.pack_thinker_prompt(job.prompt)
        call = {
            "request_id": job.request_id,
            "prompt": payload,
            "sampling": wire.pack_sampling(job.sampling),
            "max_tokens": job.max_tokens,
            "ignore_eos": job.ignore_eos,
            "want_vectors": job.want_vectors,
        }
        try:
            async with contextlib.aclosing(self.client.call("thinker.generate", call, tensors)) as replies:  # type: ignore[type-var]
                async for reply, data in replies:
                    kind = reply["type"]
                    if kind == "prompt_vectors":
                        job.events.put_nowait(("prompt_vectors", data["vectors"]))
                    elif kind == "token":
                        self.running_count = int(reply["running"])
                        self.max_running_batch = max(self.max_running_batch, int(reply["max_running"]))
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
        self._ids: dict[TalkerJob, str] = {}

    def submit(self, job: TalkerJob, *, request_id: str) -> None:
        loop = asyncio.get_running_loop()
        self._ids[job] = request_id
        self._feeds[job] = asyncio.Queue()
        self._tasks[job] = [loop.create_task(self._pump(job)), loop.create_task(self._feeder(job))]

    def feed(self, job: TalkerJob, vector: Any) -> None:
        self._feeds[job].put_nowait((vector, None))

    def text_finished(self, job: TalkerJob, text_tokens: int) -> None:
        self._feeds[job].put_nowait((None, text_tokens))

    def finish(self, job: TalkerJob, reason: str) -> None:
        if job.finish is None:
            job.finish = reason  # type: ignore[assignment]
            job.events.put_nowait(TalkerDone(reason))  # type: ignore[arg-type]
        for task in self._tasks.pop(job, []):
            task.cancel()
        self._feeds.pop(job, None)

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
            payload = {"request_id": self._ids[job], "text_done": text_done}
            await self.client.call_once("talker.feed", payload, tensors)
            if text_done is not None:
                return

    async def _pump(self, job: TalkerJob) -> None:
        payload, tensors = wire.pack_talker_admission(job.admission)
        call = {
            "request_id": self._ids[job],
            "admission": payload,
            "max_codes": job.max_codes,
            "codes_per_text_token": job.codes_per_text_token,
        }
        try:
            async with contextlib.aclosing(self.client.call("talker.generate", call, tensors)) as replies:  # type: ignore[type-var]
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


class LinkedVision:
    """The image encoder in a stage process this process started (image-encoder TP, see
    executor/vision_stage.py): what LocalStages calls instead of its own vision worker."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.client = StageLinkClient(address, connect_timeout=READY_TIMEOUT_S)

    async def wait_ready(self) -> None:
        await _wait_ready(self.client, self.address)

    async def encode(self, vision: dict[str, Any]) -> dict[str, Any]:
        try:
            _, data = await self.client.call_once("image_encoder.encode", {}, vision)
        except LinkError as exc:
            raise EngineError(f"image-encoder stage ({self.address}) failed: {exc}", status=502) from exc
        return {"image": data.get("image"), "video": data.get("video")}

    async def close(self) -> None:
        await self.client.close()


class StageSet:
    """Each stage call, routed to LocalStages or to the stage link that serves the stage."""

    def __init__(self, local: LocalStages, clients: dict[str, StageLinkClient]) -> None:
        self.local = local
        self.clients = clients
        self.thinker: Any = RemoteThinker(clients["thinker"]) if "thinker" in clients else local.thinker
        self.talker: Any = RemoteTalker(clients["talker"]) if "talker" in clients else local.talker

    @property
    def vocoder(self) -> Any:
        """The local vocoder (None when the talker runs in another process)."""
        return self.local.vocoder

    async def stop(self) -> None:
        await self.local.stop()
        for client in set(self.clients.values()):
            await client.close()

    def queue_depth(self) -> int:
        return self.local.queue_depth()

    def submit_talker(self, job: TalkerJob, *, request_id: str) -> None:
        if isinstance(self.talker, RemoteTalker):
            self.talker.submit(job, request_id=request_id)
        else:
            self.talker.submit(job)

    async def preprocess(self, request: GenerationRequest) -> Prompt:
        if "preprocessing" not in self.clients:
            return await self.local.preprocess(request)
        payload, tensors = wire.pack_request(request)
        reply, data = await self._call("preprocessing", "preprocessing.run", payload, tensors)
        return wire.unpack_prompt(reply, data)

    async def encode_audio(self, audio: dict[str, Any]) -> Any:
        if "audio_encoder" not in self.clients:
            return await self.local.encode_audio(audio)
        _, data = await self._call("audio_encoder", "audio_encoder.encode", {}, audio)
        return data["embeds"]

    async def encode_vision(self, vision: dict[str, Any]) -> dict[str, Any]:
        if "image_encoder" not in self.clients:
            return await self.local.encode_vision(vision)
        _, data = await self._call("image_encoder", "image_encoder.encode", {}, vision)
        return {"image": data.get("image"), "video": data.get("video")}

    async def aggregate(self, prompt: Prompt, *, audio: Any, image: Any, video: Any) -> ThinkerPrompt:
        if "mm_aggregate" not in self.clients:
            return await self.local.aggregate(prompt, audio=audio, image=image, video=video)
        payload, tensors = wire.pack_prompt(prompt)
        for name, value in (("audio", audio), ("image", image), ("video", video)):
            if value is not None:
                tensors[f"emb.{name}"] = value
        reply, data = await self._call("mm_aggregate", "mm_aggregate.run", payload, tensors)
        return wire.unpack_thinker_prompt(reply, data)

    async def synthesize(self, item: dict[str, Any]) -> Any:
        if "talker" not in self.clients:
            return await self.local.synthesize(item)
        _, data = await self._call("talker", "talker_stream.synthesize", item, {})
        return data["pcm"]

    async def _call(self, stage: str, method: str, payload: dict[str, Any], tensors: dict[str, Any]):
        try:
            return await self.clients[stage].call_once(method, payload, tensors)
        except LinkError as exc:
            raise EngineError(
                f"stage {stage} ({self.clients[stage].address}) failed: {exc}", status=502
            ) from exc


async def attach_remote_stages(local: LocalStages, options: EngineOptions) -> StageSet:
    """Connect to every remote stage and wait until each reports ready (loaded and warmed up)."""
    clients: dict[str, StageLinkClient] = {}
    by_address: dict[str, StageLinkClient] = {}
    for stage, address in options.remote_stages.items():
        if address not in by_address:
            by_address[address] = StageLinkClient(address, connect_timeout=READY_TIMEOUT_S)
        clients[stage] = by_address[address]
    for address, client in by_address.items():
        await _wait_ready(client, address)
    return StageSet(local, clients)


async def _wait_ready(client: StageLinkClient, address: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_TIMEOUT_S
    while True:
        try:
            health = await client.health(timeout=10.0)
            if health.get("ready"):
                return
        except (LinkError, TimeoutError) as exc:
            log.info("waiting for stage link %s: %s", address, exc)
        if loop.time() > deadline:
            raise EngineError(
                f"remote stage at {address} was not ready within {READY_TIMEOUT_S:g}s", status=503
            )
        await asyncio.sleep(0.5)
