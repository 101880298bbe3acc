"""Chat completions: request → media → engine stream → JSON reply or Server-Sent Events.

Streaming sends every text delta and every audio chunk as soon as the engine yields it. A client
that goes away cancels its generation at once: the engine stream is closed (shielded from the
cancellation that reported the disconnect), which frees the request's slot.
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from omni_runtime.api.chat.media import load_request_media
from omni_runtime.api.chat.protocol import (
    AssistantMessage,
    AudioReply,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    Choice,
    StreamChoice,
    UsageInfo,
)
from omni_runtime.api.chat.transport import (
    EventStreamResponse,
    close_stream,
    error_event,
    join_audio,
    unless_disconnected,
)
from omni_runtime.api.errors import (
    SERVICE_UNAVAILABLE,
    ApiError,
    from_engine_error,
    from_protocol_error,
    internal_error,
)
from omni_runtime.api.state import AppState
from omni_runtime.contract.engine import (
    AudioChunk,
    EngineError,
    EngineEvent,
    Finished,
    GenerationRequest,
    TextDelta,
)
from omni_runtime.media.audio import encode_wav, to_pcm16
from omni_runtime.realtime.capacity import SpeechSlot, refusal_headers

SESSION_HEADER = "X-Session-Id"
MAX_SESSION_KEY = 256
log = logging.getLogger(__name__)


@dataclass
class _Generation:
    """What one request produced so far, and when: feeds the reply, the usage and the metrics."""

    started: float
    text: list[str] = field(default_factory=list)
    audio: list[AudioChunk] = field(default_factory=list)
    first_token_at: float | None = None
    first_audio_at: float | None = None
    finished: Finished | None = None

    def add(self, event: EngineEvent) -> None:
        now = time.perf_counter()
        if isinstance(event, TextDelta):
            if self.first_token_at is None:
                self.first_token_at = now
            self.text.append(event.text)
        elif isinstance(event, AudioChunk):
            if self.first_audio_at is None:
                self.first_audio_at = now
            self.audio.append(event)
        else:
            self.finished = event


def chat_session_key(raw: Request) -> str | None:
    """The conversation-KV key of a chat request: its ``X-Session-Id`` (the router's sticky
    session header), kept apart from realtime session ids."""
    value = raw.headers.get(SESSION_HEADER)
    if value is None or not value.strip():
        return None
    if len(value) > MAX_SESSION_KEY:
        raise ApiError(
            f"the {SESSION_HEADER} header is {len(value)} characters; send at most {MAX_SESSION_KEY}",
            param=SESSION_HEADER,
            code="invalid_session_id",
        )
    return f"chat:{value}"


class ChatServing:
    def __init__(self, state: AppState) -> None:
        self.state = state

    async def create(self, request: ChatCompletionRequest, raw: Request) -> Response:
        state = self.state
        if not state.ready:
            raise ApiError(
                "The worker is still loading or warming up its model; retry when GET /ready returns 200."
                if state.startup_error is None
                else "The worker failed to start; see its log.",
                status=503,
                type=SERVICE_UNAVAILABLE,
                code="not_ready",
            )
        limits = state.serving_limits()
        request.check(limits)
        session = chat_session_key(raw)
        started = time.perf_counter()
        slot = self._admit_speech(request)
        response: Response | None = None
        state.in_flight += 1
        try:
            media = await load_request_media(request, limits=state.settings.media)
            generation = request.to_generation_request(
                request_id=f"chatcmpl-{uuid.uuid4().hex}", media=media, limits=limits
            )
            if session is not None:
                generation = replace(generation, session_key=session)
            if request.stream:
                response = await self._stream(request, generation, raw, started, slot)
            else:
                response = await self._complete(request, generation, raw, started)
            return response
        finally:
            state.in_flight -= 1
            if slot is not None and not isinstance(response, EventStreamResponse):
                slot.release()  # a streaming body holds its slot until the stream's cleanup

    def _admit_speech(self, request: ChatCompletionRequest) -> SpeechSlot | None:
        """A speech stream slot for a request with audio out; 429 when the worker is full."""
        capacity = self.state.speech
        if capacity is None or not request.wants_audio:
            return None
        slot = capacity.acquire("chat")
        if slot is None:
            raise from_protocol_error(capacity.error(), headers=refusal_headers())
        return slot

    # --- non-streaming ----------------------------------------------------------------------

    async def _complete(
        self, request: ChatCompletionRequest, generation: GenerationRequest, raw: Request, started: float
    ) -> Response:
        result = _Generation(started=started)

        async def collect() -> None:
            events = self.state.engine.generate(generation)
            try:
                async for event in events:
                    result.add(event)
            finally:
                await close_stream(events)

        disconnected, _ = await unless_disconnected(raw, collect())
        self._record(result, want_audio=generation.want_audio)
        if disconnected:
            log.info("client left before %s finished; generation cancelled", generation.request_id)
            return Response(status_code=499)  # nobody reads it; the request counter sees why it ended
        finished = self._require_finished(result, generation.request_id)
        text = "".join(result.text)
        audio = self._audio_reply(request, result, text) if generation.want_audio else None
        body = ChatCompletionResponse(
            id=generation.request_id,
            model=self.state.model_name,
            choices=[
                Choice(
                    message=AssistantMessage(content=text, audio=audio),
                    finish_reason="length" if finished.reason == "length" else "stop",
                )
            ],
            usage=self._usage(finished, want_audio=generation.want_audio),
            system_fingerprint=self.state.settings.revision,
        )
        return JSONResponse(body.model_dump(), headers={"x-request-id": generation.request_id})

    def _require_finished(self, result: _Generation, request_id: str) -> Finished:
        finished = result.finished
        if finished is None or finished.reason == "error":
            log.error(
                "engine failed on %s: %s", request_id, finished.error if finished else "stream ended early"
            )
            raise internal_error(request_id)
        if finished.reason == "cancelled":
            raise ApiError(
                "The generation was cancelled by the worker (it is shutting down); retry on another worker.",
                status=503,
                type=SERVICE_UNAVAILABLE,
                code="cancelled",
            )
        return finished

    def _audio_reply(self, request: ChatCompletionRequest, result: _Generation, text: str) -> AudioReply:
        fmt = request.audio.format if request.audio else "wav"
        pcm, rate = join_audio(result.audio, fallback_rate=self.state.engine.output_sample_rate)
        payload = encode_wav(pcm, sample_rate=rate) if fmt == "wav" else to_pcm16(pcm)
        return AudioReply(
            id=f"audio_{uuid.uuid4().hex}",
            data=base64.b64encode(payload).decode("ascii"),
            expires_at=int(time.time()) + self.state.settings.audio_expiry_s,
            transcript=text,
            format=fmt,
            sample_rate=rate,
        )

    # --- streaming --------------------------------------------------------------------------

    async def _stream(
        self,
        request: ChatCompletionRequest,
        generation: GenerationRequest,
        raw: Request,
        started: float,
        slot: SpeechSlot | None,
    ) -> Response:
        events = self.state.engine.generate(generation)
        # Wait for the first event before answering 200, so a request the engine refuses still
        # gets its error status (and a client leaving while queued still cancels it).
        try:
            disconnected, first = await unless_disconnected(raw, anext(events, None))
        except BaseException:
            await close_stream(events)
            raise
        if disconnected or first is None:
            await close_stream(events)
            if disconnected:
                return Response(status_code=499)
            log.error("engine stream of %s ended without any event", generation.request_id)
            raise internal_error(generation.request_id)
        result = _Generation(started=started)
        closed = False

        async def cleanup() -> None:  # idempotent: the body's finally and the response both call it
            nonlocal closed
            if closed:
                return
            closed = True
            await close_stream(events)
            if slot is not None:
                slot.release()
            self._record(result, want_audio=generation.want_audio)
            self.state.in_flight -= 1

        body = self._sse(request, generation, first, events, result, cleanup)
        self.state.in_flight += 1  # the SSE body holds the request now; cleanup releases it
        return EventStreamResponse(
            body,
            on_close=cleanup,
            headers={"cache-control": "no-cache", "x-request-id": generation.request_id},
        )

    async def _sse(
        self,
        request: ChatCompletionRequest,
        generation: GenerationRequest,
        first: EngineEvent,
        events: AsyncIterator[EngineEvent],
        result: _Generation,
        cleanup: Callable[[], Awaitable[None]],
    ) -> AsyncIterator[str]:
        created = int(time.time())
        audio_id = f"audio_{uuid.uuid4().hex}"
        fmt = request.audio.format if request.audio else "wav"
        include_usage = request.stream_options.include_usage if request.stream_options else None

        def chunk(delta: dict[str, Any], finish: str | None = None, usage: UsageInfo | None = None) -> str:
            payload = ChatCompletionChunk(
                id=generation.request_id,
                created=created,
                model=self.state.model_name,
                choices=[StreamChoice(delta=delta, finish_reason=finish)],  # type: ignore[arg-type]
                usage=usage,
                system_fingerprint=self.state.settings.revision,
            )
            return f"data: {payload.model_dump_json()}\n\n"

        try:
            yield chunk({"role": "assistant", "content": ""})
            event: EngineEvent | None = first
            while event is not None:
                result.add(event)
                if isinstance(event, TextDelta):
                    if event.text:
                        yield chunk({"content": event.text})
                elif isinstance(event, AudioChunk):
                    yield chunk({"audio": self._audio_delta(event, audio_id=audio_id, fmt=fmt)})
                else:
                    break
                event = await anext(events, None)
            finished = result.finished
            if finished is None or finished.reason in ("error", "cancelled"):
                if finished is None or finished.reason == "error":
                    log.error(
                        "engine failed on %s: %s", generation.request_id, finished.error if finished else ""
                    )
                    yield error_event(internal_error(generation.request_id))
                else:
                    yield error_event(
                        ApiError(
                            "The generation was cancelled by the worker.",
                            status=503,
                            type=SERVICE_UNAVAILABLE,
                            code="cancelled",
                        )
                    )
            else:
                usage = self._usage(finished, want_audio=generation.want_audio)
                reason = "length" if finished.reason == "length" else "stop"
                # OpenAI's include_usage puts usage in an extra chunk with no choices; by default the
                # omni stacks carry it on the finish chunk; include_usage=false sends none.
                yield chunk({}, finish=reason, usage=usage if include_usage is None else None)
                if include_usage:
                    final = ChatCompletionChunk(
                        id=generation.request_id,
                        created=created,
                        model=self.state.model_name,
                        choices=[],
                        usage=usage,
                    )
                    yield f"data: {final.model_dump_json()}\n\n"
            yield "data: [DONE]\n\n"
        except EngineError as exc:
            yield error_event(from_engine_error(exc))
            yield "data: [DONE]\n\n"
        finally:
            with anyio.CancelScope(shield=True):
                await cleanup()

    def _audio_delta(self, event: AudioChunk, *, audio_id: str, fmt: str) -> dict[str, Any]:
        # Each wav delta is a complete little WAV file (playable alone, header at the chunk's own
        # rate); pcm16 deltas are raw samples to append.
        payload = (
            encode_wav(event.pcm, sample_rate=event.sample_rate) if fmt == "wav" else to_pcm16(event.pcm)
        )
        return {
            "id": audio_id,
            "data": base64.b64encode(payload).decode("ascii"),
            "format": fmt,
            "sample_rate": event.sample_rate,
        }

    # --- shared -----------------------------------------------------------------------------

    def _usage(self, finished: Finished, *, want_audio: bool) -> UsageInfo:
        usage = finished.usage
        return UsageInfo(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.prompt_tokens + usage.completion_tokens,
            audio_seconds=round(usage.audio_seconds, 3) if want_audio else None,
            prompt_tokens_details={"cached_tokens": usage.cached_tokens} if usage.cached_tokens else None,
        )

    def _record(self, result: _Generation, *, want_audio: bool) -> None:
        metrics = self.state.metrics
        end = time.perf_counter()
        metrics.latency.observe(end - result.started)
        if result.first_token_at is not None:
            metrics.ttft.observe(result.first_token_at - result.started)
        if result.first_audio_at is not None:
            metrics.ttfa.observe(result.first_audio_at - result.started)
        if result.finished is not None:
            usage = result.finished.usage
            metrics.prompt_tokens.inc(usage.prompt_tokens)
            metrics.output_tokens.inc(usage.completion_tokens)
            if want_audio:
                metrics.audio_seconds.inc(usage.audio_seconds)
            if (
                result.first_token_at is not None
                and usage.completion_tokens > 1
                and end > result.first_token_at
            ):
                metrics.tokens_per_second.observe(
                    (usage.completion_tokens - 1) / (end - result.first_token_at)
                )
