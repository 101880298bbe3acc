"""One assistant response on a realtime session: engine events in, protocol events out.

A response is a task. It announces itself (``response.created``, the output item and its content
part), streams the engine's text as text or transcript deltas and its audio as base64 PCM16 deltas
at the client's rate, and always ends with the closing events and ``response.done``, whether it
completed, hit its token limit, failed or was cancelled. Deltas carry the session epoch they were
made in, so a barge-in can make every queued one stale at once (see `Outbox`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from omni_runtime.contract.engine import (
    AudioChunk,
    ChatTurn,
    Engine,
    EngineError,
    Finished,
    GenerationRequest,
    SamplingParams,
    TextDelta,
    Usage,
)
from omni_runtime.realtime.audio import StreamingResampler, float_to_b64_pcm16
from omni_runtime.realtime.errors import ENGINE_ERROR, SERVER_ERROR, invalid
from omni_runtime.realtime.outbox import Outbox
from omni_runtime.realtime.protocol import close_quietly, engine_voice, new_id
from omni_runtime.realtime.request_types import check_text
from omni_runtime.realtime.session.config import (
    MAX_OUTPUT_TOKENS,
    SessionConfig,
    integer_in,
    parse_modalities,
)
from omni_runtime.realtime.session.conversation import Conversation, Item, Part
from omni_runtime.realtime.settings import RealtimeSettings, default_max_tokens, prompt_limits

log = logging.getLogger("omni.realtime")

Status = Literal["in_progress", "completed", "cancelled", "failed", "incomplete"]
CODEC_TOKENS_PER_SECOND = 50  # Qwen-family talkers; only used to report output audio tokens


def plan_response(
    body: dict[str, Any],
    *,
    config: SessionConfig,
    conversation: Conversation,
    engine: Engine,
    settings: RealtimeSettings,
    pair_transcript: bool = False,
) -> ResponsePlan:
    """Resolve a ``response.create`` body against the session config (raises ProtocolError)."""
    want_audio = config.want_audio
    for name in ("output_modalities", "modalities"):
        if name in body:
            want_audio = parse_modalities(
                body[name], f"response.{name}", audio_out=engine.supports_audio_output
            )
            break
    if body.get("input") is not None:
        raise invalid(
            "response.input", "out-of-band input items are not supported; add items to the conversation"
        )
    target = body.get("conversation", "auto")
    if target not in ("auto", "none"):
        raise invalid("response.conversation", "expected 'auto' or 'none'")
    instructions = body.get("instructions", config.instructions)
    if not isinstance(instructions, str):
        raise invalid("response.instructions", "expected a string")
    if "instructions" in body:
        max_chars, _ = prompt_limits(engine.max_model_len, max_chars=settings.max_prompt_chars)
        check_text(instructions, param="response.instructions", max_chars=max_chars)
    audio = body.get("audio") or {}
    if not isinstance(audio, dict):
        raise invalid("response.audio", 'expected an object, such as {"output": {"voice": "alloy"}}')
    output = audio.get("output") or {}
    if not isinstance(output, dict):
        raise invalid("response.audio.output", 'expected an object, such as {"voice": "alloy"}')
    voice = output.get("voice", body.get("voice", config.voice))
    if voice is not None and not isinstance(voice, str):
        raise invalid("response.voice", "expected a voice name")
    max_tokens: Any = body.get("max_output_tokens", body.get("max_response_output_tokens"))
    if max_tokens is None or max_tokens == "inf":
        max_tokens = config.max_output_tokens or default_max_tokens(
            settings, max_model_len=engine.max_model_len
        )
    max_tokens = integer_in(max_tokens, "response.max_output_tokens", lo=1, hi=MAX_OUTPUT_TOKENS)
    temperature = body.get("temperature", config.temperature)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
        raise invalid("response.temperature", "expected a number from 0 to 2")
    metadata = body.get("metadata")
    return ResponsePlan(
        turns=conversation.turns(
            instructions=instructions,
            token_budget=max(256, engine.max_model_len - max_tokens),
            window="response",
        ),
        want_audio=want_audio,
        voice=engine_voice(voice, engine=engine, param="response.voice"),
        output_rate=config.output_rate,
        max_tokens=max_tokens,
        temperature=float(temperature),
        in_conversation=target == "auto",
        audio_delta_ms=settings.audio_delta_ms,
        metadata=metadata if isinstance(metadata, dict) else None,
        pair_transcript=pair_transcript,
    )


@dataclass(frozen=True)
class ResponsePlan:
    """Everything a response needs, resolved from the session config and the response.create body."""

    turns: tuple[ChatTurn, ...]
    want_audio: bool
    voice: str | None
    output_rate: int
    max_tokens: int
    temperature: float
    in_conversation: bool
    audio_delta_ms: int
    metadata: dict[str, Any] | None = None
    pair_transcript: bool = False  # duplex: each audio delta is followed by one transcript delta


class ResponseRun:
    def __init__(
        self,
        *,
        engine: Engine,
        outbox: Outbox,
        plan: ResponsePlan,
        item: Item,
        previous_item_id: str | None,
        turn_ended_at: float | None,
        on_first_output: Callable[[float], None] | None,
        on_finished: Callable[[ResponseRun], None],
        session_key: str | None = None,
        before: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.id = new_id("resp")
        self.session_key = session_key  # conversation KV: the engine keeps this session's KV
        self._before = before  # awaited before the engine request (stops a history warm-up)
        self.engine = engine
        self.outbox = outbox
        self.plan = plan
        self.item = item
        self.previous_item_id = previous_item_id
        self.epoch = outbox.epoch
        self.status: Status = "in_progress"
        self.cancel_reason: str | None = None
        self.failure: dict[str, Any] | None = None
        self.usage = Usage()
        self.text = ""
        self._unpaired = ""  # transcript waiting for the next audio delta (pair_transcript)
        self.audio_ms = 0.0
        self.first_audio_at: float | None = None  # monotonic time of the first audio delta
        self._turn_ended_at = turn_ended_at
        self._on_first_output = on_first_output
        self._on_finished = on_finished
        self._first_output_seen = False
        self.task: asyncio.Task[None] | None = None
        self._opened = False  # response.created queued
        self._closed = False  # response.done queued

    @property
    def part(self) -> Part:
        return self.item.content[0]

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"realtime-{self.id}")

    async def cancel(self, reason: str) -> None:
        """Stop the response now; returns when its closing events are queued."""
        if self.task is None or self.task.done():
            return
        self.cancel_reason = reason
        self.task.cancel()
        await asyncio.wait([self.task])
        if not self._closed:  # cancelled before its first step: the task body never ran
            if not self._opened:
                self._open()
            self.status = "cancelled"
            self._close()

    def played_estimate_ms(self, now: float) -> int:
        """How much audio a client playing in real time has heard (no playback.ack received)."""
        if self.first_audio_at is None:
            return 0
        return int(min(self.audio_ms, (now - self.first_audio_at) * 1000))

    # --- events -----------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        status_details: dict[str, Any] | None = None
        if self.status == "cancelled":
            status_details = {"type": "cancelled", "reason": self.cancel_reason or "client_cancelled"}
        elif self.status == "incomplete":
            status_details = {"type": "incomplete", "reason": "max_output_tokens"}
        elif self.status == "failed":
            status_details = {"type": "failed", "error": self.failure}
        usage = None
        if self.status != "in_progress":
            audio_tokens = int(self.usage.audio_seconds * CODEC_TOKENS_PER_SECOND)
            output = self.usage.completion_tokens + audio_tokens
            usage = {
                "total_tokens": self.usage.prompt_tokens + output,
                "input_tokens": self.usage.prompt_tokens,
                "output_tokens": output,
                "input_token_details": {
                    "text_tokens": self.usage.prompt_tokens,
                    "audio_tokens": 0,
                    "cached_tokens": self.usage.cached_tokens,
                },
                "output_token_details": {
                    "text_tokens": self.usage.completion_tokens,
                    "audio_tokens": audio_tokens,
                },
            }
        return {
            "id": self.id,
            "object": "realtime.response",
            "status": self.status,
            "status_details": status_details,
            "output": [] if self.status == "in_progress" else [self.item.to_json()],
            "output_modalities": ["audio"] if self.plan.want_audio else ["text"],
            "conversation_id": "conv_default" if self.plan.in_conversation else None,
            "max_output_tokens": self.plan.max_tokens,
            "metadata": self.plan.metadata,
            "usage": usage,
        }

    def _where(self) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": self.item.id, "output_index": 0, "content_index": 0}

    def _part_json(self) -> dict[str, Any]:
        if self.plan.want_audio:
            return {"type": "audio", "transcript": self.text}
        return {"type": "text", "text": self.text}

    def _first_output(self) -> None:
        if not self._first_output_seen:
            self._first_output_seen = True
            if self._on_first_output is not None and self._turn_ended_at is not None:
                self._on_first_output(time.monotonic() - self._turn_ended_at)

    def _text(self, delta: str) -> None:
        self.text += delta
        if self.plan.pair_transcript and self.plan.want_audio:
            self._unpaired += delta  # sent with the next audio delta, as one unit
            return
        kind = (
            "response.output_audio_transcript.delta" if self.plan.want_audio else "response.output_text.delta"
        )
        if not self.plan.want_audio:
            self._first_output()
        self.outbox.emit(kind, epoch=self.epoch, delta=delta, **self._where())

    def _audio(self, pcm: np.ndarray) -> None:
        step = max(1, self.plan.output_rate * self.plan.audio_delta_ms // 1000)
        for start in range(0, pcm.size, step):
            piece = pcm[start : start + step]
            if self.first_audio_at is None:
                self.first_audio_at = time.monotonic()
            self._first_output()
            self.audio_ms += piece.size * 1000 / self.plan.output_rate
            self.outbox.emit(
                "response.output_audio.delta",
                epoch=self.epoch,
                delta=float_to_b64_pcm16(piece),
                **self._where(),
            )
            if self.plan.pair_transcript:
                self._flush_transcript(always=True)

    def _flush_transcript(self, *, always: bool) -> None:
        """The transcript delta of a unit: the text since the last one ('' when there is none)."""
        if not always and not self._unpaired:
            return
        delta, self._unpaired = self._unpaired, ""
        self.outbox.emit(
            "response.output_audio_transcript.delta", epoch=self.epoch, delta=delta, **self._where()
        )

    # --- the task ---------------------------------------------------------------------------

    def _open(self) -> None:
        self._opened = True
        out = self.outbox
        out.emit("response.created", response=self.to_json())
        out.emit("response.output_item.added", response_id=self.id, output_index=0, item=self.item.to_json())
        if self.plan.in_conversation:
            out.emit(
                "conversation.item.added", previous_item_id=self.previous_item_id, item=self.item.to_json()
            )
        out.emit("response.content_part.added", part=self._part_json(), **self._where())

    async def _run(self) -> None:
        self._open()
        if self._before is not None:
            await self._before()
        request = GenerationRequest(
            request_id=self.id,
            turns=self.plan.turns,
            sampling=SamplingParams(max_tokens=self.plan.max_tokens, temperature=self.plan.temperature),
            want_audio=self.plan.want_audio,
            voice=self.plan.voice,
            session_key=self.session_key,
        )
        resampler: StreamingResampler | None = None
        finished: Finished | None = None
        stream = self.engine.generate(request)
        try:
            async for event in stream:
                if isinstance(event, TextDelta):
                    if event.text:
                        self._text(event.text)
                elif isinstance(event, AudioChunk):
                    if resampler is None:
                        resampler = StreamingResampler(
                            orig_sr=event.sample_rate, target_sr=self.plan.output_rate
                        )
                    self._audio(resampler.push(event.pcm))
                elif isinstance(event, Finished):
                    finished = event
            if resampler is not None:
                self._audio(resampler.flush())
            self._settle(finished)
        except asyncio.CancelledError:
            self.status = "cancelled"
        except EngineError as exc:
            self.status = "failed"
            self.failure = {"type": "invalid_request_error", "code": ENGINE_ERROR, "message": str(exc)}
        except Exception:
            # A fault in the engine ends this response with a failed response.done; it must not
            # leave the client waiting forever or take the session down.
            log.exception("response %s failed", self.id)
            self.status = "failed"
            self.failure = {
                "type": SERVER_ERROR,
                "code": ENGINE_ERROR,
                "message": "the worker failed while generating this response; the details are in its log",
            }
        finally:
            await close_quietly(stream)
            self._close()

    def _settle(self, finished: Finished | None) -> None:
        if finished is None:
            self.status = "failed"
            self.failure = {
                "type": SERVER_ERROR,
                "code": ENGINE_ERROR,
                "message": "the engine ended without a result",
            }
            return
        self.usage = finished.usage
        if finished.reason == "stop":
            self.status = "completed"
        elif finished.reason == "length":
            self.status = "incomplete"
        elif finished.reason == "cancelled":
            self.status = "cancelled"
            self.cancel_reason = self.cancel_reason or "client_cancelled"
        else:
            self.status = "failed"
            log.error("response %s failed in the engine: %s", self.id, finished.error)
            self.failure = {
                "type": SERVER_ERROR,
                "code": ENGINE_ERROR,
                "message": "the engine failed while generating this response; the details are in the worker log",
            }

    def _close(self) -> None:
        self._closed = True
        out = self.outbox
        part = self.part
        if self.plan.want_audio:
            self._flush_transcript(always=False)  # text spoken after the last audio delta
            part.transcript = self.text
            part.audio_ms = int(self.audio_ms)
            out.emit("response.output_audio.done", **self._where())
            out.emit("response.output_audio_transcript.done", transcript=self.text, **self._where())
        else:
            part.text = self.text
            out.emit("response.output_text.done", text=self.text, **self._where())
        out.emit("response.content_part.done", part=self._part_json(), **self._where())
        self.item.status = "completed" if self.status == "completed" else "incomplete"
        item_json = self.item.to_json()
        out.emit("response.output_item.done", response_id=self.id, output_index=0, item=item_json)
        if self.plan.in_conversation:
            out.emit("conversation.item.done", previous_item_id=self.previous_item_id, item=item_json)
        out.emit("response.done", response=self.to_json())
        self._on_finished(self)
