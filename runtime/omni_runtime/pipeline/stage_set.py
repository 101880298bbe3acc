"""The stage set the engine talks to: each stage call routed to where the stage runs.

``StageSet`` implements ``service.StageCalls`` by sending each call to this process's
``LocalStages`` or to the ``LinkedStages`` of the stage link that serves the stage, and holds the
thinker and talker services (local schedulers or their remote stand-ins), so the orchestration in
engine.py is the same code in every layout.
"""

from __future__ import annotations

import asyncio
from typing import Any

from omni_runtime.contract.adapter import Prompt, ThinkerPrompt
from omni_runtime.contract.engine import EngineError, GenerationRequest, ProcessStats
from omni_runtime.contract.options import EngineOptions
from omni_runtime.contract.stages import Stage
from omni_runtime.pipeline.remote import LinkedStages
from omni_runtime.pipeline.service import StageCalls, TalkerService, ThinkerService
from omni_runtime.pipeline.services import LocalStages


class StageSet:
    """Each stage call, routed to LocalStages or to the stage link that serves the stage."""

    def __init__(self, local: LocalStages, linked: dict[Stage, LinkedStages]) -> None:
        self.local = local
        self.linked = linked
        thinker: ThinkerService | None = (
            linked[Stage.thinker].thinker if Stage.thinker in linked else local.thinker
        )
        if thinker is None:
            raise EngineError(
                "the thinker stage is neither hosted here nor named in remote_stages", status=500
            )
        self.thinker = thinker
        self.talker: TalkerService | None = (
            linked[Stage.talker].talker if Stage.talker in linked else local.talker
        )

    def _at(self, stage: Stage) -> StageCalls:
        return self.linked.get(stage, self.local)

    @property
    def links(self) -> list[LinkedStages]:
        """Each stage link once (one serves every stage its process hosts)."""
        return list({id(link): link for link in self.linked.values()}.values())

    async def stop(self) -> None:
        await self.local.stop()
        for link in self.links:
            await link.close()

    @property
    def stat_links(self) -> list[LinkedStages]:
        """Every stage process of the worker: the stage links, and the image encoder's own
        process where this process runs it tensor-parallel there (LocalStages.vision_link)."""
        vision = self.local.vision_link
        return self.links if vision is None else [*self.links, vision]

    async def remote_stats(self) -> tuple[tuple[ProcessStats, ...], int]:
        """Each stage process's counters, asked at once; and how many did not answer in time."""
        answers = await asyncio.gather(*(link.stats() for link in self.stat_links))
        return tuple(a for a in answers if a is not None), sum(a is None for a in answers)

    async def preprocess(self, request: GenerationRequest) -> Prompt:
        return await self._at(Stage.preprocessing).preprocess(request)

    async def encode_audio(self, audio: dict[str, Any]) -> Any:
        return await self._at(Stage.audio_encoder).encode_audio(audio)

    async def encode_vision(self, vision: dict[str, Any]) -> dict[str, Any]:
        return await self._at(Stage.image_encoder).encode_vision(vision)

    async def aggregate(self, prompt: Prompt, *, audio: Any, image: Any, video: Any) -> ThinkerPrompt:
        return await self._at(Stage.mm_aggregate).aggregate(prompt, audio=audio, image=image, video=video)

    async def synthesize(self, item: dict[str, Any]) -> Any:
        return await self._at(Stage.talker).synthesize(item)


async def attach_remote_stages(local: LocalStages, options: EngineOptions) -> StageSet:
    """Connect to every remote stage and wait until each reports ready (loaded and warmed up)."""
    by_address: dict[str, LinkedStages] = {}
    linked: dict[Stage, LinkedStages] = {}
    for stage, address in options.remote_stages.items():
        if address not in by_address:
            by_address[address] = LinkedStages.connect(address)
        linked[Stage(stage)] = by_address[address]
    for link in by_address.values():
        await link.wait_ready()
    return StageSet(local, linked)
