"""The /v1/realtime state machine driven by client events, with a scripted engine and an energy VAD."""

from __future__ import annotations

import asyncio
import base64

from rt_helpers import b64_pcm16, silence, tone

TEXT_ITEM = {
    "type": "conversation.item.create",
    "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]},
}


async def test_text_turns_keep_history_and_emit_ga_events(make_driver, engine) -> None:
    drv = await make_driver()
    await drv.send(
        {
            "type": "session.update",
            "session": {"type": "realtime", "output_modalities": ["text"], "instructions": "be brief"},
        }
    )
    await drv.send(TEXT_ITEM)
    await drv.send({"type": "response.create"})
    done = await drv.until("response.done")
    assert done["response"]["status"] == "completed"
    assert done["response"]["usage"]["input_tokens"] == 20  # scripted: 10 per turn (system + user)
    text = [e["delta"] for e in drv.events if e["type"] == "response.output_text.delta"]
    assert "".join(text) == "turns2 w1 w2 w3"
    await drv.send(TEXT_ITEM)
    await drv.send({"type": "response.create"})
    await drv.until("response.done")
    # The second request sees system, user, assistant, user.
    assert [turn.role for turn in engine.requests[1].turns] == ["system", "user", "assistant", "user"]
    assert engine.requests[1].turns[2].text == "turns2 w1 w2 w3"
    assert drv.types()[:4] == [
        "session.updated",
        "conversation.item.added",
        "conversation.item.done",
        "response.created",
    ]
    assert {
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    } <= set(drv.types())


async def test_audio_in_and_audio_out_at_the_client_rate(make_driver, engine) -> None:
    drv = await make_driver()
    await drv.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "output_modalities": ["audio"],
                "audio": {
                    "input": {"format": {"type": "audio/pcm", "rate": 16000}},
                    "output": {"format": {"type": "audio/pcm", "rate": 16000}, "voice": "alloy"},
                },
            },
        }
    )
    await drv.append(tone(500, rate=16_000), rate=16_000)
    await drv.send({"type": "input_audio_buffer.commit"})
    committed = await drv.until("input_audio_buffer.committed")
    await drv.send({"type": "response.create"})
    done = await drv.until("response.done")
    request = engine.requests[0]
    (user,) = request.turns
    assert user.media[0].kind == "audio" and user.media[0].sample_rate == 16_000
    assert user.media[0].data.size == 8000
    assert request.want_audio and request.voice == "Chelsie"  # OpenAI "alloy" -> the model's Chelsie
    audio = b"".join(
        base64.b64decode(e["delta"]) for e in drv.events if e["type"] == "response.output_audio.delta"
    )
    # 4 words x 200 ms of 24 kHz tone, delivered at 16 kHz PCM16.
    assert len(audio) == 2 * 16_000 * 800 // 1000
    transcript = next(e for e in drv.events if e["type"] == "response.output_audio_transcript.done")[
        "transcript"
    ]
    assert transcript == "turns1 w1 w2 w3"
    assert done["response"]["output"][0]["content"][0] == {"type": "output_audio", "transcript": transcript}
    assert committed["item_id"] == drv.session.conversation.items[0].id


async def test_protocol_errors_answer_with_codes_and_session_survives(make_driver) -> None:
    drv = await make_driver(max_input_buffer_seconds=1.0)
    await drv.send("{not json")
    await drv.send('["a list"]')
    await drv.send({"type": "no.such.event", "event_id": "evt_client_1"})
    await drv.send({"type": "input_audio_buffer.append", "audio": "%%%"})
    await drv.send({"type": "input_audio_buffer.append"})
    await drv.send({"type": "input_audio_buffer.commit"})
    await drv.append(tone(900))
    await drv.send({"type": "input_audio_buffer.append", "audio": b64_pcm16(tone(300))})
    await drv.send({"type": "response.cancel"})
    await drv.send(
        {
            "type": "session.update",
            "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 8000}}}},
        }
    )
    await drv.send({"type": "conversation.item.delete", "item_id": "nope"})
    errors = [e["error"] for e in drv.drain() if e["type"] == "error"]
    assert [e["code"] for e in errors] == [
        "invalid_json",
        "invalid_event",
        "unknown_event_type",
        "invalid_base64",
        "missing_required_parameter",
        "input_audio_buffer_commit_empty",
        "input_audio_buffer_full",
        "response_cancel_not_active",
        "invalid_value",
        "item_not_found",
    ]
    assert errors[2]["event_id"] == "evt_client_1"
    assert errors[8]["param"] == "session.audio.input.format.rate"
    # Still alive: a normal turn works.
    await drv.send(TEXT_ITEM)
    await drv.send({"type": "response.create"})
    assert (await drv.until("response.done"))["response"]["status"] == "completed"


async def test_response_create_while_active_and_cancel(make_driver, engine) -> None:
    engine.step_s = 0.05
    engine.words = 50
    drv = await make_driver()
    await drv.send(TEXT_ITEM)
    await drv.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    await drv.until("response.output_text.delta")
    await drv.send({"type": "response.create"})
    assert drv.drain()[-1]["error"]["code"] == "conversation_already_has_active_response"
    await drv.send({"type": "response.cancel"})
    done = await drv.until("response.done")
    assert done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"]["reason"] == "client_cancelled"
    assert engine.cancelled == [engine.requests[0].request_id]


async def test_server_vad_commits_speech_and_creates_a_response(make_driver, engine) -> None:
    drv = await make_driver(vad=True)
    await drv.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {
                    "input": {
                        "turn_detection": {
                            "type": "server_vad",
                            "threshold": 0.5,
                            "prefix_padding_ms": 96,
                            "silence_duration_ms": 320,
                        }
                    }
                },
            },
        }
    )
    await drv.append(silence(1000))
    assert "input_audio_buffer.speech_started" not in drv.types()
    await drv.append(tone(800))
    started = await drv.until("input_audio_buffer.speech_started")
    assert started["audio_start_ms"] == 992  # 31 frames of 32 ms of silence before it
    await drv.append(silence(600))
    stopped = await drv.until("input_audio_buffer.speech_stopped")
    assert stopped["item_id"] == started["item_id"]
    committed = await drv.until("input_audio_buffer.committed")
    assert committed["item_id"] == started["item_id"]
    await drv.until("response.done")
    (user,) = engine.requests[0].turns
    seconds = user.media[0].data.size / 16_000
    assert 0.8 + 0.096 <= seconds <= 0.8 + 0.096 + 0.32 + 0.1  # padding + speech + the confirming silence


async def test_vad_interrupts_a_response_without_duplex(make_driver, engine) -> None:
    engine.step_s = 0.05
    engine.words = 100
    drv = await make_driver(vad=True)
    await drv.send(TEXT_ITEM)
    await drv.send({"type": "response.create"})
    await drv.until("response.output_audio.delta")
    await drv.append(tone(200))
    await drv.until("input_audio_buffer.speech_started")
    done = await drv.until("response.done")
    assert done["response"]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}


async def test_duplex_barge_in_drops_stale_audio_and_trims_to_the_ack(make_driver, engine) -> None:
    engine.step_s = 0.02
    engine.words = 200
    drv = await make_driver(duplex=True)
    await drv.send(
        {
            "type": "session.update",
            "session": {
                "duplex": {"backchannel_max_ms": 0},
                "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 320}}},
            },
        }
    )
    await drv.send(TEXT_ITEM)
    await drv.send({"type": "response.create"})
    first = await drv.until("response.output_audio.delta")
    await drv.send({"type": "playback.ack", "item_id": first["item_id"], "audio_end_ms": 300})
    await asyncio.sleep(0.1)  # deltas pile up in the outbox, not yet sent
    assert drv.session.outbox._queue.qsize() > 0
    await drv.append(tone(200))
    events = drv.drain()
    start = [e["type"] for e in events].index("input_audio_buffer.speech_started")
    after = events[start:]
    # Every queued delta of the interrupted response was dropped unsent; none arrives after the barge-in.
    assert not [e for e in events if e.get("epoch") == first["epoch"]]
    assert drv.session.metrics.stale_dropped._value.get() > 0
    done = next(e for e in after if e["type"] == "response.done")
    assert done["response"]["status_details"]["reason"] == "turn_detected"
    truncated = next(e for e in after if e["type"] == "conversation.item.truncated")
    assert truncated["audio_end_ms"] == 300 and truncated["item_id"] == first["item_id"]
    item = drv.session.conversation.get(first["item_id"])
    assert item.played_ms == 300


async def test_duplex_backchannel_does_not_cancel_but_long_speech_does(make_driver, engine) -> None:
    engine.step_s = 0.02
    engine.words = 400
    drv = await make_driver(duplex=True)
    await drv.send(
        {
            "type": "session.update",
            "session": {
                "duplex": {"backchannel_max_ms": 600},
                "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 320}}},
            },
        }
    )
    await drv.send(TEXT_ITEM)
    await drv.send({"type": "response.create"})
    await drv.until("response.output_audio.delta")
    await drv.append(tone(300))  # "uh-huh"
    await drv.append(silence(500))
    await drv.until("input_audio_buffer.speech_stopped")
    assert drv.session.response is not None  # still talking
    assert "input_audio_buffer.committed" not in drv.types()
    assert drv.session.metrics.backchannels._value.get() == 1
    await drv.append(tone(1000))  # a real interruption
    done = await drv.until("response.done")
    assert done["response"]["status_details"]["reason"] == "turn_detected"
    await drv.append(silence(500))
    await drv.until("input_audio_buffer.committed")
    await drv.until("response.created")  # the interruption became the next turn


async def test_duplex_trims_by_realtime_estimate_without_ack(make_driver, engine) -> None:
    engine.step_s = 0.05
    engine.words = 100
    drv = await make_driver(duplex=True)
    await drv.send({"type": "session.update", "session": {"duplex": {"backchannel_max_ms": 0}}})
    await drv.send(TEXT_ITEM)
    await drv.send({"type": "response.create"})
    first = await drv.until("response.output_audio.delta")
    await asyncio.sleep(0.3)
    await drv.append(tone(200))
    truncated = await drv.until("conversation.item.truncated")
    # Real-time playback since the first delta: about 300 ms (scheduling adds a little).
    assert 250 <= truncated["audio_end_ms"] <= 700
    item = drv.session.conversation.get(first["item_id"])
    assert item.output_audio_ms() > truncated["audio_end_ms"]


async def test_item_truncate_retrieve_and_delete(make_driver) -> None:
    drv = await make_driver()
    await drv.send(TEXT_ITEM)
    await drv.send({"type": "response.create"})
    done = await drv.until("response.done")
    item_id = done["response"]["output"][0]["id"]
    await drv.send(
        {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 5000}
    )
    assert drv.drain()[-1]["error"]["param"] == "audio_end_ms"
    await drv.send(
        {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 400}
    )
    assert (await drv.until("conversation.item.truncated"))["audio_end_ms"] == 400
    await drv.send({"type": "conversation.item.retrieve", "item_id": item_id})
    retrieved = await drv.until("conversation.item.retrieved")
    assert retrieved["item"]["content"][0]["transcript"] == "turns1"  # 400 of 800 ms: w1 not finished
    await drv.send({"type": "conversation.item.delete", "item_id": item_id})
    assert (await drv.until("conversation.item.deleted"))["item_id"] == item_id
    assert [item.role for item in drv.session.conversation.items] == ["user"]


async def test_item_create_with_audio_image_previous_item_and_beta_names(make_driver, engine) -> None:
    import io

    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 10, 10)).save(png, format="PNG")
    data_uri = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    drv = await make_driver(beta=True)
    await drv.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_audio", "audio": b64_pcm16(tone(500))},
                    {"type": "input_image", "image_url": data_uri},
                    {"type": "input_text", "text": "what is this"},
                ],
            },
        }
    )
    created = await drv.until("conversation.item.created")
    await drv.send(
        {
            "type": "conversation.item.create",
            "previous_item_id": "root",
            "item": {
                "type": "message",
                "role": "system",
                "content": [{"type": "input_text", "text": "rules"}],
            },
        }
    )
    await drv.send({"type": "response.create", "response": {"modalities": ["text"]}})
    await drv.until("response.text.delta")  # beta name for output_text.delta
    await drv.until("response.done")
    system, user = engine.requests[0].turns
    assert system.text == "rules" and user.text == "what is this"
    assert [m.kind for m in user.media] == ["audio", "image"]
    assert user.media[0].data.size == 8000 and user.media[1].data.shape == (48, 64, 3)
    assert created["item"]["content"][0]["type"] == "input_audio"
    assert "conversation.item.done" not in drv.types()


async def test_idle_timeout_triggers_a_response(make_driver, engine) -> None:
    drv = await make_driver(vad=True)
    await drv.send(
        {
            "type": "session.update",
            "session": {
                "audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 5000}}}
            },
        }
    )
    drv.session.config = drv.session.config.__class__(
        **{
            **drv.session.config.__dict__,
            "turn_detection": drv.session.config.turn_detection.__class__(idle_timeout_ms=50),
        }
    )  # the protocol's minimum is 5 s; a test waits 50 ms
    await drv.send(TEXT_ITEM)
    await drv.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    await drv.until("response.done")
    await drv.until("input_audio_buffer.timeout_triggered")
    await drv.until("response.done")
    assert len(engine.requests) == 2


async def test_the_history_is_warmed_once_per_turn_on_the_users_first_audio(make_driver, engine) -> None:
    """Conversation KV: the user's first audio of a turn asks the engine to prefill the history
    (Engine.warm_session, keyed by the session); more audio does not; a response or a history
    edit re-arms it; a response waits for a warm-up under way."""
    drv = await make_driver()
    session = drv.session
    append = {"type": "input_audio_buffer.append", "audio": b64_pcm16(tone(100))}
    await drv.send(TEXT_ITEM)
    await drv.send(append)
    await drv.send(append)
    await asyncio.sleep(0)
    assert len(engine.warmed) == 1 and engine.warmed[0].session_key == session.id
    assert [t.text for t in engine.warmed[0].turns] == ["hello"]
    await drv.send({"type": "input_audio_buffer.commit"})
    await drv.send({"type": "response.create"})
    await drv.until("response.done")
    await drv.send(append)  # the next turn: the history now holds the reply
    await drv.send(append)
    await asyncio.sleep(0)
    assert len(engine.warmed) == 2 and [t.role for t in engine.warmed[1].turns] == [
        "user",
        "user",
        "assistant",
    ]
    await drv.send({"type": "conversation.item.delete", "item_id": session.conversation.items[0].id})
    await drv.send(append)  # the history changed: warmed again
    await asyncio.sleep(0)
    assert len(engine.warmed) == 3 and [t.role for t in engine.warmed[2].turns] == ["user", "assistant"]
    assert session.warmer.started == 3 and not session.warmer.running


async def test_a_response_stops_a_warm_up_still_under_way_instead_of_waiting(make_driver, engine) -> None:
    drv = await make_driver()
    cancelled = asyncio.Event()

    async def slow_warm_up(request) -> int:  # a warm-up that would outlast the user's turn
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        return 0

    engine.warm_session = slow_warm_up
    await drv.send(TEXT_ITEM)
    await drv.send({"type": "input_audio_buffer.append", "audio": b64_pcm16(tone(200))})
    await asyncio.sleep(0)
    assert drv.session.warmer.running
    await drv.send({"type": "input_audio_buffer.commit"})
    await drv.send({"type": "response.create"})
    done = await drv.until("response.done")
    assert done["response"]["status"] == "completed" and cancelled.is_set()
    assert not drv.session.warmer.running and len(engine.requests) == 1


async def test_speech_is_encoded_chunk_by_chunk_while_it_is_spoken(make_driver, engine) -> None:
    """With an engine whose audio encoder takes 2 s chunks on their own, each whole chunk of the
    turn being spoken (plus the 50 ms its last features look past it) is sent to be encoded as
    soon as it exists; the committed turn's audio starts with exactly those samples."""
    engine.audio_chunk_samples = 32_000
    drv = await make_driver()
    piece = {"type": "input_audio_buffer.append", "audio": b64_pcm16(tone(100))}
    for _ in range(21):  # 2.1 s: one whole chunk and 0.1 s
        await drv.send(piece)
    assert [len(m[0].data) for m in engine.prefetched_prefixes] == [32_800]
    for _ in range(30):  # 5.1 s
        await drv.send(piece)
    assert [len(m[0].data) for m in engine.prefetched_prefixes] == [32_800, 64_800]
    assert all(m[0].kind == "audio" and m[0].sample_rate == 16_000 for m in engine.prefetched_prefixes)
    await drv.send({"type": "input_audio_buffer.commit"})
    await drv.until("input_audio_buffer.committed")
    committed = drv.session.conversation.items[-1].content[0].audio
    for (media,) in engine.prefetched_prefixes:
        assert (committed[: len(media.data)] == media.data).all()
    for _ in range(21):  # the next turn starts its own chunks at its own first sample
        await drv.send(piece)
    assert [len(m[0].data) for m in engine.prefetched_prefixes] == [32_800, 64_800, 32_800]
    await drv.send({"type": "input_audio_buffer.clear"})
    for _ in range(10):
        await drv.send(piece)
    assert len(engine.prefetched_prefixes) == 3, "1 s after a clear: no whole chunk yet"


async def test_an_engine_without_chunked_audio_encodes_nothing_early(make_driver, engine) -> None:
    drv = await make_driver()
    for _ in range(30):
        await drv.send({"type": "input_audio_buffer.append", "audio": b64_pcm16(tone(100))})
    assert engine.prefetched_prefixes == [] and engine.prefetched == []
