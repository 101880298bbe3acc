"""The stage-service protocol: what the engine calls for each stage, wherever the stage runs.

``LocalStages`` (services.py) serves a stage with this process's adapter and workers;
``LinkedStages`` (remote.py) serves it through a stage link to another process; ``StageSet``
(stage_set.py) routes each call to the one that hosts the stage. The thinker and talker are
continuous-batching schedulers: a job is submitted, feeds events into its own queue, and is
finished (cancelled) by the engine; the local schedulers and their remote stand-ins share one
interface below, so the engine's orchestration is the same code in both cases.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from omni_runtime.contract.adapter import Prompt, ThinkerPrompt
from omni_runtime.contract.engine import GenerationRequest
from omni_runtime.pipeline.scheduler import FinishReason, ThinkerJob
from omni_runtime.pipeline.talker import TalkerJob


class ThinkerService(Protocol):
    def submit(self, job: ThinkerJob) -> None: ...

    def finish(self, job: ThinkerJob, reason: FinishReason) -> None: ...

    def end_session(self, session: str) -> None:
        """Forget the session's conversation KV."""
        ...

    def hold(self) -> AbstractAsyncContextManager[None]:
        """Pause decode steps while held (a thinker in another process is never paused)."""
        ...

    @property
    def waiting_count(self) -> int:
        """Prompts waiting for their prefill (0 where the thinker runs in another process)."""
        ...


class TalkerService(Protocol):
    def submit(self, job: TalkerJob) -> None: ...

    def feed(self, job: TalkerJob, vector: Any) -> None: ...

    def text_finished(self, job: TalkerJob, text_tokens: int) -> None: ...

    def finish(self, job: TalkerJob, reason: FinishReason) -> None: ...

    def end_session(self, session: str) -> None:
        """Forget the session's kept talker KV."""
        ...


class StageCalls(Protocol):
    """The request/response stage calls (tensors travel as opaque values)."""

    async def preprocess(self, request: GenerationRequest) -> Prompt: ...

    async def encode_audio(self, audio: dict[str, Any]) -> Any: ...

    async def encode_vision(self, vision: dict[str, Any]) -> dict[str, Any]: ...

    async def aggregate(self, prompt: Prompt, *, audio: Any, image: Any, video: Any) -> ThinkerPrompt: ...

    async def synthesize(self, item: dict[str, Any]) -> Any: ...
