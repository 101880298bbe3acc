"""One /v1/realtime socket in vLLM's transcription dialect: appended audio in, the model's text out.

vLLM's flow: ``session.update`` (model), a first ``input_audio_buffer.commit`` that starts the stream,
then appends, and a last commit with ``final: true`` that ends the input; the server streams
``transcription.delta`` and ends with ``transcription.done`` (full text and usage). Here the
"transcription" is the model's answer to the user's audio.

Our engine takes whole requests, so the input is served step by step: a commit with new audio (at
least `MIN_STEP_MS`) runs a step on the audio appended since the previous step, whose prompt is
everything so far (earlier audio and the text the earlier steps produced), so the deltas of all
steps read as one text, as in vLLM's incremental requests. A commit made while a step runs is
served when it ends. ``final: true`` runs a last step on what is left, then sends
``transcription.done`` with usage summed the way vLLM sums it (largest prompt, all completion
tokens) and vLLM-Omni's closing ``response.output_audio.done``. The next commit starts a new
utterance. Audio output (``modalities: ["text", "audio"]``) is sent as vLLM-Omni sends it:
``response.output_audio.delta`` with base64 PCM16 at the model's own rate (``sample_rate_hz``).
Every client mistake is an ``error`` event (``{"error": message, "code": ...}``, vLLM's shape) and
the session goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_runtime.contract.engine import (
    AudioChunk,
    ChatTurn,
    Engine,
    EngineError,
    EngineEvent,
    Finished,
    GenerationRequest,
    MediaInput,
    SamplingParams,
    TextDelta,
)
from omni_runtime.contract.sessions import make_session_id
from omni_runtime.realtime.audio import float_to_b64_pcm16
from omni_runtime.realtime.errors import BUFFER_FULL, ENGINE_ERROR, SERVER_ERROR, ProtocolError
from omni_runtime.realtime.metrics import RealtimeMetrics
from omni_runtime.realtime.outbox import Outbox
from omni_runtime.realtime.protocol import close_quietly, engine_voice, new_id
from omni_runtime.realtime.settings import RealtimeSettings, default_max_tokens, prompt_limits
from omni_runtime.realtime.transcription.events import (
    INPUT_RATE,
    TranscriptionConfig,
    apply_session_update,
    parse_append,
    parse_commit,
    parse_event,
)

log = logging.getLogger("omni.realtime")
MIN_STEP_MS = 100  # a non-final commit with less new audio waits for more


@dataclass
class Utterance:
    """The input between a first commit and ``final``: its steps so far and what they produced."""

    history: list[ChatTurn] = field(default_factory=list)  # user audio and answer text, step by step
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    sent_audio: bool = False

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


class AudioBuffer:
    """Appended 16 kHz audio not yet handed to a step (the dialect has no other rate: no resampling).

    Every step's prompt holds all the audio of its utterance, so the limit is on the utterance: what
    waits here plus what earlier steps of the utterance took.
    """

    def __init__(self, *, max_samples: int) -> None:
        self.max_samples = max_samples
        self._chunks: list[np.ndarray] = []
        self.size = 0  # samples waiting for a commit
        self.taken = 0  # samples of this utterance already handed to steps

    def ms(self, samples: int) -> int:
        return samples * 1000 // INPUT_RATE

    def append(self, pcm: np.ndarray) -> None:
        held = self.size + self.taken
        if held + pcm.size > self.max_samples:
            raise ProtocolError(
                f"this utterance holds {self.ms(held) / 1000:.1f} s of audio; appending {self.ms(pcm.size) / 1000:.1f} s "
                f"more would pass the limit of {self.ms(self.max_samples) / 1000:g} s "
                '(end the utterance with {"type": "input_audio_buffer.commit", "final": true})',
                code=BUFFER_FULL,
                param="audio",
            )
        self._chunks.append(pcm)
        self.size += pcm.size

    def take(self, *, final: bool) -> np.ndarray:
        """The waiting audio; after a final take the next utterance starts from nothing."""
        audio = np.concatenate(self._chunks) if self._chunks else np.zeros(0, dtype=np.float32)
        self.taken = 0 if final else self.taken + self.size
        self._chunks, self.size = [], 0
        return audio


@dataclass(frozen=True)
class Segment:
    """Audio a commit handed over (None: nothing new), and whether that commit was ``final``."""

    audio: np.ndarray | None
    final: bool

    def then(self, later: Segment) -> Segment:
        parts = [part for part in (self.audio, later.audio) if part is not None]
        return Segment(audio=np.concatenate(parts) if parts else None, final=later.final)


class TranscriptionSession:
    duplex = False  # never resumable: the duplex machinery is the OpenAI dialect's

    def __init__(
        self,
        *,
        engine: Engine,
        settings: RealtimeSettings,
        metrics: RealtimeMetrics,
        session_id: str | None = None,
        outbox: Outbox | None = None,
        created_at: float | None = None,
    ) -> None:
        self.id = session_id or make_session_id(worker_id=settings.worker_id, prefix="rt")
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.outbox = outbox or Outbox(beta=False, keep_log=False, max_log_events=0, max_log_bytes=0)
        self.created_at = time.monotonic() if created_at is None else created_at
        self.max_prompt_chars, _ = prompt_limits(engine.max_model_len, max_chars=settings.max_prompt_chars)
        self.config = TranscriptionConfig(
            model=engine.model_name,
            max_tokens=default_max_tokens(settings, max_model_len=engine.max_model_len),
            instructions=settings.default_instructions,
        )
        self.input = AudioBuffer(max_samples=int(settings.max_input_buffer_seconds * INPUT_RATE))
        self.utterance = Utterance()
        self.steps = 0  # engine requests made (observability and tests)
        self._segments: asyncio.Queue[Segment] = asyncio.Queue()
        self._runner: asyncio.Task[None] | None = None

    # --- lifecycle ------------------------------------------------------------------------

    async def open(self) -> None:
        """Announce the session the way vLLM does (its id and creation time)."""
        self.outbox.emit("session.created", id=self.id, created=int(time.time()))

    async def close(self) -> None:
        if self._runner is not None and not self._runner.done():
            self._runner.cancel()  # cancels the step in flight; its engine request is closed
            await asyncio.wait([self._runner])
        self.engine.end_session(self.id)  # the conversation KV its steps kept
        self.outbox.close()

    def error(self, exc: ProtocolError) -> None:
        self.metrics.errors.labels(kind="realtime", code=exc.code).inc()
        self.outbox.emit("error", error=exc.message, code=exc.code, param=exc.param)

    # --- client events ----------------------------------------------------------------------

    async def handle_text(self, text: str) -> None:
        try:
            event = parse_event(text, max_bytes=self.settings.max_event_bytes)
            if event["type"] == "session.update":
                self._session_update(event)
            elif event["type"] == "input_audio_buffer.append":
                self.input.append(parse_append(event, max_bytes=self.settings.max_event_bytes))
            else:
                self._commit(final=parse_commit(event))
        except ProtocolError as exc:
            self.error(exc)

    def _session_update(self, event: dict[str, Any]) -> None:
        config = apply_session_update(
            self.config,
            event,
            served_model=self.engine.model_name,
            audio_out=self.engine.supports_audio_output,
            max_prompt_chars=self.max_prompt_chars,
            max_model_len=self.engine.max_model_len,
        )
        if config.voice != self.config.voice:
            engine_voice(config.voice, engine=self.engine, param="voice")
        self.config = config  # applies from the next step on; a step in flight keeps its settings

    def _commit(self, *, final: bool) -> None:
        # The audio is taken now, so appends after this commit belong to the next one.
        held = self.input.size
        if final or self.input.ms(held) >= MIN_STEP_MS:
            audio = self.input.take(final=final)
            self._segments.put_nowait(Segment(audio=audio if held else None, final=final))
            if self._runner is None or self._runner.done():
                self._runner = asyncio.create_task(self._serve(), name=f"realtime-{self.id}")

    # --- steps ------------------------------------------------------------------------------

    async def _serve(self) -> None:
        """Serve committed segments in order, one step at a time, for the life of the session."""
        while True:
            segment = await self._segments.get()
            # Commits that queued up while a step ran are served together, up to a final one.
            while not segment.final and not self._segments.empty():
                segment = segment.then(self._segments.get_nowait())
            if segment.audio is not None:
                await self._step(segment.audio)
            if segment.final:
                self._finish()

    def _finish(self) -> None:
        utterance = self.utterance
        self.outbox.emit("transcription.done", text=utterance.text, usage=utterance.usage())
        # vLLM-Omni closes every generation with this, audio or not, so its clients never wait.
        self.outbox.emit("response.output_audio.done", has_audio=utterance.sent_audio)
        self.utterance = Utterance()

    def _request(self, audio: np.ndarray) -> GenerationRequest:
        config = self.config
        turns: list[ChatTurn] = []
        if config.instructions:
            turns.append(ChatTurn(role="system", text=config.instructions))
        turns.extend(self.utterance.history)
        turns.append(
            ChatTurn(role="user", media=(MediaInput(kind="audio", data=audio, sample_rate=INPUT_RATE),))
        )
        return GenerationRequest(
            request_id=new_id("tr"),
            turns=tuple(turns),
            sampling=SamplingParams(max_tokens=config.max_tokens, temperature=config.temperature),
            want_audio=config.want_audio,
            voice=engine_voice(config.voice, engine=self.engine, param="voice")
            if config.want_audio
            else None,
            session_key=self.id,  # conversation KV: the next step reuses the history's prefix
        )

    async def _step(self, audio: np.ndarray) -> None:
        """One engine request on the new audio; its text and audio stream out as they come."""
        utterance = self.utterance
        try:
            request = self._request(audio)
        except ProtocolError as exc:  # a voice the engine lost since the session.update chose it
            self.error(exc)
            return
        self.steps += 1
        text = ""
        finished: Finished | None = None
        stream: AsyncIterator[EngineEvent] | None = None
        try:
            stream = self.engine.generate(request)
            async for event in stream:
                if isinstance(event, TextDelta) and event.text:
                    text += event.text
                    utterance.text += event.text
                    self.outbox.emit("transcription.delta", delta=event.text)
                elif isinstance(event, AudioChunk) and event.pcm.size:
                    utterance.sent_audio = True
                    self.outbox.emit(
                        "response.output_audio.delta",
                        audio=float_to_b64_pcm16(event.pcm),
                        format="pcm16",
                        sample_rate_hz=event.sample_rate,
                    )
                elif isinstance(event, Finished):
                    finished = event
        except EngineError as exc:
            self.error(ProtocolError(str(exc), code=ENGINE_ERROR, param=exc.param, status=exc.status))
            return
        except Exception:
            # An engine fault fails this step, never the session: the client hears why and goes on.
            log.exception("transcription step of session %s failed", self.id)
            finished = Finished(reason="error")
        finally:
            if stream is not None:
                await close_quietly(stream)
        if finished is None or finished.reason == "error":
            if finished is not None and finished.error:
                log.error(
                    "transcription step of session %s failed in the engine: %s", self.id, finished.error
                )
            self.error(
                ProtocolError(
                    "the engine failed on this audio; the details are in the worker log",
                    code=ENGINE_ERROR,
                    type=SERVER_ERROR,
                    status=500,
                )
            )
            return
        utterance.prompt_tokens = max(utterance.prompt_tokens, finished.usage.prompt_tokens)
        utterance.completion_tokens += finished.usage.completion_tokens
        # The next step's prompt: this audio and what was said about it.
        utterance.history.append(request.turns[-1])
        utterance.history.append(ChatTurn(role="assistant", text=text))
