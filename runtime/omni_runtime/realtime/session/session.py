"""The /v1/realtime session state machine: client events in, server events out (no torch here).

One `RealtimeSession` per socket. It owns the session config, the conversation, the input audio
buffer with its turn detector, and at most one active response. Client events are handled one at a
time in arrival order; a response runs as its own task, so audio keeps arriving (and VAD keeps
listening) while the assistant speaks — that is what full duplex needs. Every client mistake is
answered with an ``error`` event and the session goes on. Conversation items
(``conversation.item.create|delete|truncate|retrieve``) and the duplex ``playback.ack`` are handled
here too; `items.parse_item` turns an item body into an `Item`.

Turn taking (server VAD): speech start announces ``speech_started``; speech stop commits the spoken
audio (with ``prefix_padding_ms`` before it) as a user item and, with ``create_response``, starts a
response. Speech while the assistant talks interrupts it (``interrupt_response``). In duplex
sessions an overlap policy applies first: speech shorter than ``backchannel_max_ms`` ("uh-huh") is
a backchannel and neither cancels nor becomes a turn; longer speech is a barge-in (`overlap.py`:
cancel, drop stale audio, trim history to the client's ``playback.ack``). Model-driven duplex
(``auto_response``) ends turns by a per-unit listen/speak decision instead (`duplex.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from omni_runtime.contract.engine import Engine, MediaInput
from omni_runtime.contract.sessions import make_session_id
from omni_runtime.realtime.audio import MODEL_RATE, decode_b64, pcm16_to_float
from omni_runtime.realtime.errors import (
    COMMIT_EMPTY,
    NO_ACTIVE_RESPONSE,
    RESPONSE_ACTIVE,
    UNKNOWN_EVENT,
    ProtocolError,
    invalid,
    missing,
)
from omni_runtime.realtime.metrics import RealtimeMetrics
from omni_runtime.realtime.outbox import Outbox
from omni_runtime.realtime.protocol import engine_voice, new_id, read_event
from omni_runtime.realtime.request_types import check_text
from omni_runtime.realtime.session.config import SessionConfig, apply_update
from omni_runtime.realtime.session.conversation import Conversation, Item, Part
from omni_runtime.realtime.session.duplex import (
    DuplexDriver,
    append_hints,
    commit_create_response,
    probe_session_key,
)
from omni_runtime.realtime.session.input_audio import EarlyEncoding, InputAudio
from omni_runtime.realtime.session.items import parse_item
from omni_runtime.realtime.session.overlap import Overlap
from omni_runtime.realtime.session.playback import PlaybackCursor
from omni_runtime.realtime.session.response import ResponseRun, plan_response
from omni_runtime.realtime.session.turn_detection import (
    FRAME_MS,
    Listener,
    SpeechLong,
    SpeechScorer,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
)
from omni_runtime.realtime.session.warmup import PrefixWarmer
from omni_runtime.realtime.settings import RealtimeSettings, prompt_limits

MIN_COMMIT_MS = 100  # the OpenAI API refuses shorter commits with the same code
# Client events that change what the next prompt's history holds (see session/warmup.py).
HISTORY_EVENTS = frozenset(
    {
        "session.update",
        "conversation.item.create",
        "conversation.item.delete",
        "conversation.item.truncate",
        "playback.ack",
        "barge_in",
    }
)
Handler = Callable[[dict[str, Any]], Awaitable[None]]


class RealtimeSession:
    def __init__(
        self,
        *,
        engine: Engine,
        settings: RealtimeSettings,
        metrics: RealtimeMetrics,
        duplex: bool,
        beta: bool,
        duplex_names: bool = False,
        scorer_factory: Callable[[], SpeechScorer],
    ) -> None:
        self.id = make_session_id(worker_id=settings.worker_id, prefix="rt")
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.duplex = duplex
        self.config = SessionConfig.initial(
            model=engine.model_name, audio_out=engine.supports_audio_output, settings=settings, duplex=duplex
        )
        self.outbox = Outbox(
            beta=beta,
            keep_log=duplex,
            max_log_events=settings.max_replay_events,
            max_log_bytes=settings.max_replay_bytes,
            on_stale=metrics.stale_dropped.inc,
            duplex_names=duplex_names,
        )
        self.conversation = Conversation(max_items=settings.max_conversation_items)
        self.max_prompt_chars, _ = prompt_limits(engine.max_model_len, max_chars=settings.max_prompt_chars)
        self.input = InputAudio(
            input_rate=self.config.input_rate, max_seconds=settings.max_input_buffer_seconds
        )
        self.response: ResponseRun | None = None
        self.last_response: ResponseRun | None = None
        self.playback = PlaybackCursor()
        self.driver = DuplexDriver(self)
        self.overlap = Overlap(self)
        self.warmer = PrefixWarmer(self)
        self.early = EarlyEncoding(engine.audio_chunk_samples)
        self.created_at = time.monotonic()
        self._scorer_factory = scorer_factory
        self._scorer: SpeechScorer | None = None
        self._listener: Listener | None = None
        self._speech_item_id: str | None = None
        self._overlap = False  # speech began while the assistant talked; backchannel or barge-in?
        self._last_commit_at: float | None = None
        self._idle_task: asyncio.Task[None] | None = None
        self._handlers: dict[str, Handler] = {
            "session.update": self._session_update,
            "input_audio_buffer.append": self._append,
            "input_audio_buffer.commit": self._commit,
            "input_audio_buffer.clear": self._clear,
            "conversation.item.create": self._item_create,
            "conversation.item.delete": self._item_delete,
            "conversation.item.truncate": self._item_truncate,
            "conversation.item.retrieve": self._item_retrieve,
            "response.create": self._response_create,
            "response.cancel": self._response_cancel,
            "playback.ack": self.overlap.playback_ack,
            "barge_in": self.overlap.barge_in_event,
        }

    # --- lifecycle ------------------------------------------------------------------------

    async def open(self, **announce: Any) -> None:
        """Configure VAD and send ``session.created`` (with ``announce``'s extra top-level fields)."""
        await self._configure_vad()
        self.outbox.emit("session.created", session=self._session_json(), **announce)

    async def close(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
        self.warmer.close()
        if self.response is not None:
            self.outbox.bump_epoch()
            await self.response.cancel("session_closed")
        for key in (self.id, probe_session_key(self.id)):  # the conversation KV it kept
            self.engine.end_session(key)
        self.outbox.close()

    @property
    def listener(self) -> Listener | None:
        return self._listener

    def end_overlap(self) -> None:
        self._overlap = False

    def _session_json(self) -> dict[str, Any]:
        return self.config.to_json(session_id=self.id, beta=self.outbox.beta, duplex=self.duplex)

    def error(self, exc: ProtocolError, *, event_id: str | None = None) -> None:
        self.metrics.errors.labels(kind="realtime", code=exc.code).inc()
        self.outbox.emit("error", error=exc.error_body(event_id=event_id))

    # --- dispatch ---------------------------------------------------------------------------

    async def handle_text(self, text: str) -> None:
        event_id: str | None = None
        try:
            event = read_event(text, max_bytes=self.settings.max_event_bytes)
            if isinstance(event.get("event_id"), str):
                event_id = event["event_id"]
            handler = self._handlers.get(event["type"])
            if handler is None:
                raise ProtocolError(
                    f"unknown event type {event['type']!r}; supported: {', '.join(sorted(self._handlers))}",
                    code=UNKNOWN_EVENT,
                    param="type",
                )
            await handler(event)
            if event["type"] in HISTORY_EVENTS:
                self.warmer.rearm()  # the history changed: warm it again on the user's next audio
        except ProtocolError as exc:
            self.error(exc, event_id=event_id)

    # --- session ----------------------------------------------------------------------------

    async def _session_update(self, event: dict[str, Any]) -> None:
        if "session" not in event:
            raise missing("session", where="session.update")
        old = self.config
        new = apply_update(
            old, event["session"], audio_out=self.engine.supports_audio_output, duplex=self.duplex
        )
        if new.voice != old.voice:
            engine_voice(new.voice, engine=self.engine, param="session.audio.output.voice")
        if new.instructions != old.instructions:
            check_text(new.instructions, param="session.instructions", max_chars=self.max_prompt_chars)
        self.config = new
        if self.config.input_rate != old.input_rate:
            await self._listen(self.input.set_rate(self.config.input_rate))
        if (self.config.turn_detection, self.config.backchannel_max_ms) != (
            old.turn_detection,
            old.backchannel_max_ms,
        ):
            await self._configure_vad()
        self.outbox.emit("session.updated", session=self._session_json())

    async def _configure_vad(self) -> None:
        vad = self.config.turn_detection
        if vad is None:
            self._listener = None
            self._overlap = False
            return
        long_ms = self.config.backchannel_max_ms if self.duplex and self.config.backchannel_max_ms else None
        if self._listener is not None:
            detector = self._listener.detector
            detector.threshold = vad.threshold
            detector.silence_duration_ms = vad.silence_duration_ms
            detector.long_speech_ms = long_ms
            return
        if self._scorer is None:
            # The first scorer loads the VAD model (once per process): keep that off the event loop.
            self._scorer = await asyncio.to_thread(self._scorer_factory)
        self._scorer.reset()
        detector = TurnDetector(
            threshold=vad.threshold, silence_duration_ms=vad.silence_duration_ms, long_speech_ms=long_ms
        )
        self._listener = Listener(
            scorer=self._scorer, detector=detector, origin_ms=self.input.ms(self.input.total)
        )

    # --- input audio ------------------------------------------------------------------------

    async def _append(self, event: dict[str, Any]) -> None:
        if "audio" not in event:
            raise missing("audio", where="input_audio_buffer.append")
        hints = append_hints(event) if self.duplex else (False, False)  # checked before any audio is kept
        data = decode_b64(event["audio"], param="audio", max_bytes=self.settings.max_event_bytes)
        samples = self.input.append(pcm16_to_float(data, param="audio"))
        self.warmer.on_user_audio()
        await self._listen(samples)
        self._encode_early()
        if self.duplex:
            await self.driver.on_append(hints, samples.size)

    async def _commit(self, event: dict[str, Any]) -> None:
        create = commit_create_response(event) if self.duplex else None
        held = self.input.ms(self.input.size)
        if held < MIN_COMMIT_MS:
            raise ProtocolError(
                f"the input audio buffer holds {held} ms; a commit needs at least {MIN_COMMIT_MS} ms of audio",
                code=COMMIT_EMPTY,
            )
        item_id = self._speech_item_id or new_id("item")
        self._speech_item_id = None
        self.commit_audio(self.input.take(), item_id)
        if self.duplex:
            await self.driver.after_commit(create)

    def _encode_early(self) -> None:
        """Encode the whole chunks of the turn being spoken (EarlyEncoding), so that at the end of
        speech only its last chunk is left for the audio encoder."""
        early = self.early
        if early.chunk is None:
            return
        if early.start is not None and early.start < self.input.start:
            early.reset()  # its start was dropped (a backchannel): those chunks will not recur
        if early.start is None and self.config.turn_detection is None:
            early.begin(self.input.start)  # a manual commit takes the whole buffer
        end = early.due(self.input.total)
        if end is None or early.start is None:
            return
        audio = self.input.peek(start=early.start)[: end - early.start]
        if self.engine.prefetch_media(
            [MediaInput(kind="audio", data=audio, sample_rate=MODEL_RATE)], audio_prefix=True
        ):
            self.warmer.on_speech_encoded(audio)

    async def _clear(self, event: dict[str, Any]) -> None:
        self.early.reset()
        self.warmer.forget_speech()
        self.input.clear()
        if self._listener is not None:
            self._listener.reset_pending()
        self.outbox.emit("input_audio_buffer.cleared")

    def commit_audio(self, samples: np.ndarray, item_id: str) -> None:
        self.early.reset()
        self.warmer.forget_speech()
        item = Item(id=item_id, role="user", content=[Part(type="input_audio", audio=samples)])
        previous = self.conversation.add(item)
        self._last_commit_at = time.monotonic()
        self.outbox.emit("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous)
        self._announce_item(item, previous)

    def _announce_item(self, item: Item, previous: str | None) -> None:
        self.outbox.emit("conversation.item.added", previous_item_id=previous, item=item.to_json())
        self.outbox.emit("conversation.item.done", previous_item_id=previous, item=item.to_json())

    # --- conversation items ----------------------------------------------------

    async def _item_create(self, event: dict[str, Any]) -> None:
        if "item" not in event:
            raise missing("item", where="conversation.item.create")
        item = await parse_item(
            event["item"],
            input_rate=self.config.input_rate,
            max_bytes=self.settings.max_event_bytes,
            max_text_chars=self.max_prompt_chars,
            media_limits=self.settings.media_limits,
            existing={existing.id for existing in self.conversation.items},
        )
        previous_id = event.get("previous_item_id")
        if previous_id is not None and not isinstance(previous_id, str):
            raise invalid("previous_item_id", "expected an item id or 'root'")
        previous = self.conversation.add(item, previous_item_id=previous_id)
        self._announce_item(item, previous)

    async def _item_delete(self, event: dict[str, Any]) -> None:
        item_id = event.get("item_id")
        if not isinstance(item_id, str):
            raise missing("item_id", where="conversation.item.delete")
        if self.response is not None and self.response.item.id == item_id:
            raise invalid(
                "item_id", "the item belongs to the response in progress; cancel the response first"
            )
        self.conversation.delete(item_id)
        self.outbox.emit("conversation.item.deleted", item_id=item_id)

    async def _item_truncate(self, event: dict[str, Any]) -> None:
        item_id, end_ms = event.get("item_id"), event.get("audio_end_ms")
        if not isinstance(item_id, str):
            raise missing("item_id", where="conversation.item.truncate")
        if isinstance(end_ms, bool) or not isinstance(end_ms, int) or end_ms < 0:
            raise invalid("audio_end_ms", "expected milliseconds of audio to keep (an integer >= 0)")
        item = self.conversation.get(item_id)
        if item.role != "assistant" or not any(part.type == "output_audio" for part in item.content):
            raise invalid("item_id", "only an assistant message with audio can be truncated")
        total = item.output_audio_ms()
        in_progress = self.response is not None and self.response.item is item
        if end_ms > total and not in_progress:
            raise invalid("audio_end_ms", f"{end_ms} ms is past the end of the item's audio ({total} ms)")
        item.played_ms = end_ms
        content_index = event.get("content_index", 0)
        self.outbox.emit(
            "conversation.item.truncated", item_id=item_id, content_index=content_index, audio_end_ms=end_ms
        )

    async def _item_retrieve(self, event: dict[str, Any]) -> None:
        item_id = event.get("item_id")
        if not isinstance(item_id, str):
            raise missing("item_id", where="conversation.item.retrieve")
        item = self.conversation.get(item_id)
        self.outbox.emit(
            "conversation.item.retrieved",
            item=item.to_json(with_audio=True, input_rate=self.config.input_rate),
        )

    # --- server VAD and turn taking ---------------------------------------------------------

    async def _listen(self, samples: np.ndarray) -> None:
        listener = self._listener
        if listener is None:
            return
        for turn in await listener.feed(samples):
            if self._listener is not listener:
                return  # turn detection was switched off while we scored
            if isinstance(turn, SpeechStarted):
                await self._speech_started(turn)
            elif isinstance(turn, SpeechStopped):
                await self._speech_stopped(turn)
            elif isinstance(turn, SpeechLong) and self._overlap:
                await self.overlap.barge_in(
                    reason="long_speech"
                )  # longer than a backchannel: the user takes the turn
        vad = self.config.turn_detection
        if not listener.in_speech and vad is not None and not self.driver.holds_turn():
            # Outside speech only the prefix padding can still become part of a turn.
            keep_ms = vad.prefix_padding_ms + 2 * FRAME_MS
            self.input.drop_before(self.input.total - self.input.position(keep_ms))

    async def _speech_started(self, turn: SpeechStarted) -> None:
        self._speech_item_id = new_id("item")
        if self._idle_task is not None:
            self._idle_task.cancel()
        self.outbox.emit(
            "input_audio_buffer.speech_started",
            audio_start_ms=turn.audio_start_ms,
            item_id=self._speech_item_id,
        )
        vad = self.config.turn_detection
        if vad is None:
            return
        talking = self.overlap.assistant_talking()
        self.driver.on_speech(turn.audio_start_ms, vad.prefix_padding_ms)
        self.early.begin(self.input.position(max(0, turn.audio_start_ms - vad.prefix_padding_ms)))
        if not talking:
            return
        if self.duplex:
            if self.config.backchannel_max_ms == 0:
                await self.overlap.barge_in(reason="speech_started")
            else:
                self._overlap = True  # decided by SpeechLong (barge-in) or SpeechStopped (backchannel)
        elif vad.interrupt_response:
            await self.overlap.barge_in(reason="speech_started")

    async def _speech_stopped(self, turn: SpeechStopped) -> None:
        item_id = self._speech_item_id or new_id("item")
        self._speech_item_id = None
        self.outbox.emit("input_audio_buffer.speech_stopped", audio_end_ms=turn.audio_end_ms, item_id=item_id)
        if self._overlap:
            # A backchannel: the assistant keeps talking and the "uh-huh" does not become a turn.
            self._overlap = False
            self.input.drop_before(self.input.position(turn.audio_end_ms))
            self.metrics.backchannels.inc()
            vad = self.config.turn_detection
            self.driver.on_backchannel(turn.audio_start_ms, vad.prefix_padding_ms if vad else 0)
            self.overlap.decision("backchannel", "short_speech")
            return
        if self.driver.active:
            return  # model-driven: the unit clock decides when the turn ends (session/duplex.py)
        vad = self.config.turn_detection
        padding = vad.prefix_padding_ms if vad else 0
        start = self.input.position(max(0, turn.audio_start_ms - padding))
        samples = self.input.take(start=start, end=self.input.position(turn.audio_end_ms))
        if samples.size == 0:
            return
        self.commit_audio(samples, item_id)
        if vad is not None and vad.create_response and self.response is None:
            self.start_response({}, turn_ended_at=time.monotonic())

    # --- responses --------------------------------------------------------------------------

    async def _response_create(self, event: dict[str, Any]) -> None:
        if self.response is not None:
            raise ProtocolError(
                f"response {self.response.id} is in progress; cancel it or wait for its response.done",
                code=RESPONSE_ACTIVE,
            )
        body = event.get("response") or {}
        if not isinstance(body, dict):
            raise invalid("response", "expected an object")
        turn_ended_at, self._last_commit_at = self._last_commit_at, None
        self.start_response(body, turn_ended_at=turn_ended_at)

    def start_response(self, body: dict[str, Any], *, turn_ended_at: float | None) -> ResponseRun:
        """Start a response now (synchronous, so two triggers can never start two)."""
        plan = plan_response(
            body,
            config=self.config,
            conversation=self.conversation,
            engine=self.engine,
            settings=self.settings,
            pair_transcript=self.duplex,
        )
        if self._idle_task is not None:
            self._idle_task.cancel()
        part = Part(type="output_audio" if plan.want_audio else "output_text")
        item = Item(id=new_id("item"), role="assistant", status="in_progress", content=[part])
        previous = self.conversation.add(item) if plan.in_conversation else None
        run = ResponseRun(
            engine=self.engine,
            outbox=self.outbox,
            plan=plan,
            item=item,
            previous_item_id=previous,
            turn_ended_at=turn_ended_at,
            on_first_output=self.metrics.first_output.observe,
            on_finished=self._response_finished,
            session_key=self.id,
            before=self.warmer.settle,
        )
        self.response = run
        self.last_response = run
        self.playback.started(run)
        run.start()
        return run

    def _response_finished(self, run: ResponseRun) -> None:
        self.metrics.responses.labels(status=run.status).inc()
        if self.response is run:
            self.response = None
        self.warmer.rearm()
        vad = self.config.turn_detection
        if vad is not None and vad.idle_timeout_ms is not None and run.status == "completed":
            # The idle clock starts when the reply has finished playing (OpenAI semantics).
            delay = vad.idle_timeout_ms / 1000 + run.audio_ms / 1000
            self._idle_task = asyncio.create_task(self._idle_timeout(delay))

    async def _idle_timeout(self, delay: float) -> None:
        await asyncio.sleep(delay)
        if self.response is not None or (self._listener is not None and self._listener.in_speech):
            return
        item_id = new_id("item")
        start_ms, end_ms = self.input.ms(self.input.start), self.input.ms(self.input.total)
        self.outbox.emit(
            "input_audio_buffer.timeout_triggered",
            audio_start_ms=start_ms,
            audio_end_ms=end_ms,
            item_id=item_id,
        )
        samples = self.input.take()
        if self.input.ms(samples.size) >= MIN_COMMIT_MS:
            self.commit_audio(samples, item_id)
        try:
            self.start_response({}, turn_ended_at=None)
        except ProtocolError as exc:
            self.error(exc)

    async def _response_cancel(self, event: dict[str, Any]) -> None:
        if self.response is None:
            raise ProtocolError("there is no response in progress to cancel", code=NO_ACTIVE_RESPONSE)
        wanted = event.get("response_id")
        if wanted is not None and wanted != self.response.id:
            raise invalid("response_id", f"{wanted!r} is not the response in progress ({self.response.id})")
        run = self.response
        await self.cancel_response("client_cancelled")
        if self.duplex:
            self.overlap.trim_to_played(run)

    async def cancel_response(self, reason: str) -> None:
        run = self.response
        if run is None:
            return
        self.outbox.bump_epoch()  # from here on no queued delta of this response is sent
        await run.cancel(reason)
