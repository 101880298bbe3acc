"""Streaming-input sessions: input arrives in chunks, the answer comes once input ends.

Chunks may arrive out of order and more than once (client retries): they are placed by
``sequence_id`` (or by byte ``offset``, translated to the next id once the bytes before them are
in), duplicates are acknowledged and ignored, and they are assembled strictly in order, so any
arrival order gives the request one whole upload would have made. The start policy decides when
work begins: ``on_end_only`` waits for the end of input; ``on_first_chunk`` (at once) and
``on_min_length`` (once enough payload is in order) decode each chunk when the chunks before it
are in and send images and video frame pairs to the engine's encoders ahead of the request
(`assembly`); ``started`` turns true when work was submitted (that, or the request itself).
Generation starts when the input is complete (``end_of_input``, an end marker, or ``finish``) and
streams into a replayable event list (SSE) and a final chat completion (``result``, `answer`).
A 413 (past the payload or chunk cap) closes the session.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import Any, Literal

from omni_runtime.contract.engine import (
    ChatTurn,
    Engine,
    GenerationRequest,
    SamplingParams,
)
from omni_runtime.media.errors import MediaError
from omni_runtime.realtime.errors import (
    INVALID_MEDIA,
    PAYLOAD_TOO_LARGE,
    SEQUENCE_OUT_OF_WINDOW,
    SESSION_FINISHED,
    TOO_MANY_MESSAGES,
    ProtocolError,
    invalid,
)
from omni_runtime.realtime.protocol import engine_voice
from omni_runtime.realtime.request_types import too_long
from omni_runtime.realtime.settings import RealtimeSettings, default_max_tokens, prompt_limits
from omni_runtime.realtime.streaming_input import answer, chat_format
from omni_runtime.realtime.streaming_input.assembly import Assembly
from omni_runtime.realtime.streaming_input.chunks import OffsetOrder, chunk_bytes
from omni_runtime.realtime.streaming_input.models import Chunk, Modality, State, StreamingInputParams


class StreamingInputSession:
    def __init__(
        self, *, session_id: str, params: StreamingInputParams, engine: Engine, settings: RealtimeSettings
    ) -> None:
        self.id = session_id
        self.params = params
        self.engine = engine
        self.settings = settings
        self.policy = params.start_policy or settings.start_policy
        self.min_length = params.min_length or settings.min_length_bytes
        self.created = chat_format.now()
        self.last_activity = time.monotonic()
        self.state: State = "collecting"
        self.started = False
        self.received_bytes = 0
        self.in_order_bytes = 0
        self._pending: dict[int, tuple[Modality, bytes]] = {}
        self._seen: set[int] = set()
        self._max_seen: int | None = None
        self._first_gap = 0  # the lowest sequence id not received yet
        self.next_seq = 0
        self.end_seq: int | None = None
        self._assembly = self._new_assembly()
        # Offset-addressed chunks (``offset`` instead of ``sequence_id``) wait here until the bytes
        # before them are in, then take the next sequence id.
        self.addressing: Literal["sequence_id", "offset"] | None = None
        self.offsets = OffsetOrder()
        self.completion = chat_format.completion_id()
        self.events: list[str] = []  # SSE payloads, replayable from the start
        self._changed = asyncio.Condition()
        self.result: dict[str, Any] | None = None
        self.failure: ProtocolError | None = None
        self._task: asyncio.Task[None] | None = None
        self.want_audio = "audio" in params.modalities
        self.audio_format = params.audio.format if params.audio is not None else "wav"
        if self.want_audio and not engine.supports_audio_output:
            raise invalid("modalities", "this worker serves text only; use ['text']")
        cap = settings.max_payload_per_session
        if params.min_length is not None and params.min_length > cap:
            # A session never holds more than the cap, so the decode would never start early.
            raise invalid(
                "min_length", f"is {params.min_length} bytes; this worker holds at most {cap} a session"
            )
        self.max_chars, max_messages = prompt_limits(
            engine.max_model_len,
            max_chars=settings.max_prompt_chars,
            max_messages=settings.max_prompt_messages,
        )
        earlier = params.messages or []
        if len(earlier) + 1 > max_messages:
            raise ProtocolError(
                f"messages holds {len(earlier)} earlier turns; with the streamed one this worker takes at most "
                f"{max_messages} messages",
                code=TOO_MANY_MESSAGES,
                param="messages",
            )
        # Text of the turn so far (instructions and earlier messages included), bounded by max_chars.
        self.text_chars = len(params.instructions or "")
        for index, message in enumerate(earlier):
            self._count_text(len(message.content), param=f"messages[{index}].content")
        self.voice = engine_voice(
            params.requested_voice, engine=engine, param="voice" if params.voice else "audio.voice"
        )

    def _new_assembly(self) -> Assembly:
        return Assembly(
            audio_rate=self.params.audio_sample_rate,
            video_fps=self.params.video_fps,
            limits=self.settings.media_limits,
        )

    def _count_text(self, chars: int, *, param: str) -> None:
        if self.text_chars + chars > self.max_chars:
            raise too_long(param, chars=self.text_chars + chars, max_chars=self.max_chars)
        self.text_chars += chars

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    def missing_count(self) -> int:
        """Chunks still missing before the end of input (0 while the end is unknown): counted, not listed."""
        if self.end_seq is None:
            return 0
        return max(0, self.end_seq + 1 - self.next_seq - len(self._pending))

    def first_missing(self, limit: int = 100) -> list[int]:
        """The first ``limit`` missing sequence ids; the loop ends after ``limit + len(pending)`` steps."""
        out: list[int] = []
        if self.end_seq is None:
            return out
        seq = self._first_gap
        while seq <= self.end_seq and len(out) < limit:
            if seq not in self._pending:
                out.append(seq)
            seq += 1
        return out

    def status(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "session_id": self.id,
            "object": "streaming_input.session",
            "status": self.state,
            "started": self.started,
            "received_bytes": self.received_bytes,
            "chunks_received": len(self._seen),
            "next_expected": self.next_seq,
            "end_sequence_id": self.end_seq,
            "missing": self.first_missing(),
            "missing_count": self.missing_count(),
            "next_offset": self.offsets.next_offset if self.addressing == "offset" else None,
            "prefetched": self._assembly.prefetched,
            "expires_in": int(self.settings.session_timeout_s),
        }

    # --- input ------------------------------------------------------------------------------

    def _payload(self, chunk: Chunk) -> tuple[Modality, bytes]:
        modality, raw, chars = chunk_bytes(
            chunk, received=self.received_bytes, cap=self.settings.max_payload_per_session
        )
        if chars is not None:
            self._count_text(
                chars, param=f"{chunk.place}.text" if chunk.payload is None else f"{chunk.place}.payload"
            )
        return modality, raw

    def _address(self, mode: Literal["sequence_id", "offset"]) -> None:
        if self.addressing not in (None, mode):
            raise invalid(
                mode,
                f"this session places its chunks by {self.addressing}; send {self.addressing}, not {mode}",
            )
        self.addressing = mode

    async def add_chunk(self, chunk: Chunk) -> dict[str, Any]:
        self.touch()
        if chunk.end_marker:  # {"end_of_input": true} alone: the end of input, idempotent
            ack = await self.finish()
            return {**ack, "session_id": self.id, "accepted": True, "duplicate": False}
        if chunk.offset is not None:
            return await self._add_at_offset(chunk, chunk.offset)
        assert chunk.sequence_id is not None  # the model requires one of the two
        self._address("sequence_id")
        seq = chunk.sequence_id
        ack = {"session_id": self.id, "sequence_id": seq}
        if seq in self._seen:
            return {**ack, "accepted": False, "duplicate": True, "started": self.started}
        self._check_place(seq, end=chunk.end_of_input)
        modality, raw = self._payload(chunk)
        await self._accept(seq, modality, raw, end=chunk.end_of_input)
        return {**ack, "accepted": True, "duplicate": False, "started": self.started, "status": self.state}

    def _check_place(self, seq: int, *, end: bool) -> None:
        if self.state != "collecting" or (self.end_seq is not None and seq > self.end_seq):
            raise ProtocolError(
                f"sequence_id {seq} comes after the end of input (sequence {self.end_seq}); the session takes no more chunks",
                code=SESSION_FINISHED,
                param="sequence_id",
                status=409,
            )
        window = self.settings.sequence_window
        if seq >= self._first_gap + window:
            raise ProtocolError(
                f"sequence_id {seq} is {seq - self._first_gap} ahead of the first id not yet received "
                f"({self._first_gap}); a chunk may run at most {window} ahead (the sequence window): "
                "send the chunks in between first",
                code=SEQUENCE_OUT_OF_WINDOW,
                param="sequence_id",
            )
        if len(self._seen) + len(self.offsets.waiting) >= self.settings.max_chunks_per_session:
            raise ProtocolError(
                f"a session may carry at most {self.settings.max_chunks_per_session} chunks, so the session is closed",
                code=PAYLOAD_TOO_LARGE,
                param="sequence_id",
                status=413,
            )
        if end and self._max_seen is not None and seq < self._max_seen:
            raise invalid(
                "sequence_id", f"end_of_input on {seq}, but chunk {self._max_seen} was already sent"
            )

    async def _accept(self, seq: int, modality: Modality, raw: bytes, *, end: bool) -> None:
        self._seen.add(seq)
        self._max_seen = seq if self._max_seen is None else max(self._max_seen, seq)
        while self._first_gap in self._seen:  # each id is stepped over once in a session
            self._first_gap += 1
        self._pending[seq] = (modality, raw)
        self.received_bytes += len(raw)
        if end:
            self.end_seq = seq
        await self._advance()

    async def _add_at_offset(self, chunk: Chunk, offset: int) -> dict[str, Any]:
        """Offset addressing: a chunk waits until the bytes before it are in, then takes the next id."""
        self._address("offset")
        order, ack = self.offsets, {"session_id": self.id, "offset": offset}
        if offset in order.seen:
            return {**ack, "accepted": False, "duplicate": True, "started": self.started}
        if self.state != "collecting" or self.end_seq is not None:
            raise ProtocolError(
                f"offset {offset} comes after the end of input; the session takes no more chunks",
                code=SESSION_FINISHED,
                param="offset",
                status=409,
            )
        order.check(offset)
        self._check_place(self._first_gap, end=False)
        modality, raw = self._payload(chunk)
        order.add(offset, modality, raw, end=chunk.end_of_input, place=chunk.place)
        self.received_bytes += len(raw)
        while self.state == "collecting" and (ready := order.pop_ready()) is not None:
            self.received_bytes -= len(ready[1])  # counted again by _accept
            await self._accept(self._first_gap, ready[0], ready[1], end=ready[2])
        if order.end_requested and not order.waiting:
            await self.finish()
        return {
            **ack,
            "accepted": True,
            "duplicate": False,
            "next_offset": order.next_offset,
            "started": self.started,
            "status": self.state,
        }

    async def finish(self) -> dict[str, Any]:
        """End of input (idempotent): the last chunk is the highest sequence id received (with
        offsets: the input ends at the first byte not received)."""
        self.touch()
        if self.offsets.waiting:  # bytes still missing before these: the end comes once they are in
            self.offsets.end_requested = True
        elif self.end_seq is None and self.state == "collecting":
            self.end_seq = -1 if self._max_seen is None else self._max_seen
        await self._advance()
        return self.status()

    async def _advance(self) -> None:
        if self.state != "collecting":
            return
        early = self.policy == "on_first_chunk" or (
            self.policy == "on_min_length" and self._in_order_bytes() >= self.min_length
        )
        # Every pending id lies in [next_seq, end_seq], so the input is complete when they fill it.
        complete = self.end_seq is not None and len(self._pending) == self.end_seq + 1 - self.next_seq
        if early or complete:
            await self._assemble()
        if early and self.state == "collecting":
            # Work submitted ahead of the request: media preprocessed and encoded as it arrives.
            self._assembly.prefetch(self.engine)
            self.started = self.started or self._assembly.prefetched > 0
        if complete:
            self._begin()

    def _in_order_bytes(self) -> int:
        total, seq = self.in_order_bytes, self.next_seq
        while seq in self._pending:
            total += len(self._pending[seq][1])
            seq += 1
        return total

    async def _assemble(self) -> None:
        while self.next_seq in self._pending and self.state == "collecting":
            seq = self.next_seq
            modality, raw = self._pending.pop(seq)
            self.in_order_bytes += len(raw)
            self.next_seq += 1
            try:
                await self._assembly.add(modality, raw)
            except MediaError as exc:
                self.fail(
                    ProtocolError(
                        f"chunks[{seq}].payload: {exc.message} (image and video chunks are JPEG/PNG frames)",
                        code=INVALID_MEDIA,
                        param=f"chunks[{seq}].payload",
                    )
                )
                return

    # --- generation -------------------------------------------------------------------------

    def request(self) -> GenerationRequest:
        asm, params = self._assembly, self.params
        media = asm.media()
        turns: list[ChatTurn] = []
        if params.instructions:
            turns.append(ChatTurn(role="system", text=params.instructions))
        turns.extend(ChatTurn(role=m.role, text=m.content) for m in params.messages or [])
        turns.append(ChatTurn(role="user", text="".join(asm.text), media=tuple(media)))
        stop = (params.stop,) if isinstance(params.stop, str) else tuple(params.stop or ())
        return GenerationRequest(
            request_id=self.completion,
            turns=tuple(turns),
            sampling=SamplingParams(
                max_tokens=params.max_tokens
                or default_max_tokens(self.settings, max_model_len=self.engine.max_model_len),
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                min_p=params.min_p,
                repetition_penalty=params.repetition_penalty,
                stop=stop,
                seed=params.seed,
            ),
            want_audio=self.want_audio,
            voice=self.voice,
        )

    def _begin(self) -> None:
        if self.state != "collecting":
            return
        try:
            request = self.request()
        except ValueError as exc:
            self.fail(invalid("chunks", str(exc)))
            return
        self.state = "generating"
        self.started = True  # the request itself is submitted now
        self._task = asyncio.create_task(answer.generate(self, request))

    async def publish(self, event: dict[str, Any] | str) -> None:
        async with self._changed:
            self.events.append(chat_format.sse(event))
            self._changed.notify_all()

    def fail(self, error: ProtocolError) -> None:
        self.failure = error
        self.state = "failed"
        self.events.append(chat_format.sse({"error": error.error_body()}))
        self.events.append(chat_format.sse("[DONE]"))
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_result(self, timeout: float) -> None:
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: self.state in ("done", "failed", "cancelled")), timeout
            )

    async def stream_events(self) -> Any:
        """SSE payloads from the first one; ends after [DONE]."""
        index = 0
        while True:
            async with self._changed:
                await self._changed.wait_for(partial(self._has_news, index))
                fresh = self.events[index:]
            if not fresh:
                return
            for payload in fresh:
                yield payload
            index += len(fresh)
            if fresh[-1] == chat_format.sse("[DONE]"):
                return

    def _has_news(self, index: int) -> bool:
        return index < len(self.events) or self.state == "cancelled"

    async def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.state in ("collecting", "generating"):
            self.state = "cancelled"
        self._pending.clear()
        self._assembly = self._new_assembly()
        await self._notify()
