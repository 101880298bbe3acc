"""Duplex session behaviour on the scripted engine: the unit clock, the model's probe, history per ack."""

from __future__ import annotations

import pytest
from rt_helpers import silence, tone

NO_VAD = {"input": {"turn_detection": None}}


async def model_driven(make_driver, **duplex):
    drv = await make_driver(duplex=True)
    await drv.send(
        {
            "type": "session.update",
            "session": {
                "audio": NO_VAD,
                "output_modalities": ["text"],
                "extra_body": {"auto_response": True, **duplex},
            },
        }
    )
    await drv.until("session.updated")
    return drv


async def test_forced_units_listen_then_the_thinker_speaks(make_driver, engine) -> None:
    drv = await model_driven(make_driver, force_listen_count=2)
    await drv.append(tone(3100))
    listens = [e for e in drv.types() if e == "response.listen"]
    assert len(listens) == 2
    speak = await drv.until("response.speak")
    assert speak["metadata"] == {"model_speak": True, "reason": "model_speak", "unit_index": 2}
    created = await drv.until("response.created")
    assert created["response"]["id"] == speak["response_id"]
    await drv.until("response.done")
    probe, reply = engine.requests[0], engine.requests[1]
    assert (probe.sampling.max_tokens, probe.sampling.temperature, probe.want_audio) == (1, 0.0, False)
    assert probe.turns[-1].role == "user" and probe.turns[-1].media[0].kind == "audio"
    assert reply.turns[-1].media[0].data.size >= 16_000 * 3 - 512  # the whole pending turn was committed
    metrics = drv.session.metrics
    assert metrics.duplex_probes.labels(reason="length")._value.get() == 1
    assert metrics.duplex_decisions.labels(action="listen", reason="force_listen_count")._value.get() == 2


async def test_a_thinker_that_ends_its_turn_at_once_keeps_listening(make_driver, engine) -> None:
    engine.words = 0  # end of sequence as the first token
    engine.reply_words = lambda request: []  # type: ignore[method-assign]
    drv = await model_driven(make_driver)
    await drv.append(tone(2100))
    drv.drain()
    decisions = [e for e in drv.events if e["type"] == "response.listen"]
    assert [d["response"]["metadata"]["reason"] for d in decisions] == ["model_listen", "model_listen"]
    assert all(d["response"]["metadata"]["model_listen"] for d in decisions)
    assert "response.created" not in drv.types() and len(engine.requests) == 2


async def test_client_force_listen_holds_a_unit(make_driver, engine) -> None:
    drv = await model_driven(make_driver)
    await drv.send({"type": "input_audio_buffer.append", "audio": "", "force_listen": True})
    await drv.append(tone(1050))
    listen = await drv.until("response.listen")
    assert listen["response"]["metadata"]["reason"] == "client_force_listen" and not engine.requests


async def test_playback_ack_by_response_id_trims_on_cancel(make_driver, engine) -> None:
    engine.step_s = 0.05
    engine.words = 40
    drv = await make_driver(duplex=True)
    await drv.send({"type": "response.create", "response": {"output_modalities": ["audio"]}})
    first = await drv.until("response.output_audio.delta")
    for _ in range(7):  # 800 ms of audio generated; the client has played 300 ms
        await drv.until("response.output_audio.delta")
    await drv.send({"type": "playback.ack", "response_id": first["response_id"], "played_ms": 300})
    ack = await drv.until("playback.acknowledged")
    assert (ack["item_id"], ack["played_ms"]) == (first["item_id"], 300)
    await drv.send({"type": "response.cancel"})
    await drv.until("response.done")
    truncated = await drv.until("conversation.item.truncated")
    assert (truncated["item_id"], truncated["audio_end_ms"]) == (first["item_id"], 300)


async def test_speech_over_a_finished_reply_trims_it_to_the_ack(make_driver, engine) -> None:
    drv = await make_driver(duplex=True)
    await drv.send({"type": "session.update", "session": {"duplex": {"backchannel_max_ms": 0}}})
    await drv.send({"type": "response.create", "response": {"output_modalities": ["audio"]}})
    done = await drv.until("response.done")
    item_id = done["response"]["output"][0]["id"]
    await drv.send({"type": "playback.ack", "item_id": item_id, "audio_end_ms": 450})  # of 800 ms
    await drv.append(tone(600))
    decision = await drv.until("overlap.decision")
    assert (decision["action"], decision["reason"]) == ("barge_in", "speech_started")
    truncated = await drv.until("conversation.item.truncated")
    assert (truncated["item_id"], truncated["audio_end_ms"]) == (item_id, 450)
    assert (
        drv.session.conversation.get(item_id).history_text() == "turns0"
    )  # 8 of 15 characters, back to a word


async def test_a_fully_played_reply_is_not_interrupted(make_driver, engine) -> None:
    drv = await make_driver(duplex=True)
    await drv.send({"type": "session.update", "session": {"duplex": {"backchannel_max_ms": 0}}})
    await drv.send({"type": "response.create", "response": {"output_modalities": ["audio"]}})
    done = await drv.until("response.done")
    item_id = done["response"]["output"][0]["id"]
    await drv.send({"type": "playback.ack", "item_id": item_id, "audio_end_ms": 800})
    await drv.append(tone(600))
    await drv.append(silence(700))
    await drv.until("response.created")  # the speech is a new turn
    assert "overlap.decision" not in drv.types() and "conversation.item.truncated" not in drv.types()


HOSTILE = [
    ({"type": "playback.ack", "played_ms": "abc"}, "played_ms", "invalid_value"),
    ({"type": "playback.ack", "played_ms": -5}, "played_ms", "invalid_value"),
    ({"type": "playback.ack", "played_ms": True}, "played_ms", "invalid_value"),
    ({"type": "playback.ack", "audio_end_ms": [1]}, "audio_end_ms", "invalid_value"),
    ({"type": "playback.ack"}, "played_ms", "missing_required_parameter"),
    ({"type": "playback.ack", "played_ms": 5}, "item_id", "missing_required_parameter"),  # nothing played yet
    ({"type": "playback.ack", "played_ms": 5, "item_id": 7}, "item_id", "invalid_value"),
    ({"type": "playback.ack", "played_ms": 5, "response_id": {}}, "response_id", "invalid_value"),
    (
        {"type": "playback.ack", "played_ms": 5, "response_id": "resp_nope"},
        "response_id",
        "playback_item_not_found",
    ),
    ({"type": "playback.ack", "played_ms": 5, "item_id": "item_nope"}, "item_id", "item_not_found"),
    ({"type": "barge_in"}, None, "response_cancel_not_active"),
    (
        {"type": "input_audio_buffer.append", "audio": "", "force_listen": "yes"},
        "force_listen",
        "invalid_value",
    ),
    (
        {"type": "input_audio_buffer.append", "audio": "", "force_barge_in": 1},
        "force_barge_in",
        "invalid_value",
    ),
    (
        {"type": "session.update", "session": {"extra_body": {"auto_response": "on"}}},
        "session.extra_body.auto_response",
        "invalid_value",
    ),
    (
        {"type": "session.update", "session": {"extra_body": {"force_listen_count": 10**9}}},
        "session.extra_body.force_listen_count",
        "invalid_value",
    ),
    (
        {"type": "session.update", "session": {"duplex": {"unit_ms": "1s"}}},
        "session.duplex.unit_ms",
        "invalid_value",
    ),
    ({"type": "session.update", "session": {"extra_body": []}}, "session.extra_body", "invalid_value"),
    (
        {"type": "session.update", "session": {"audio": NO_VAD}},
        "session.audio.input.turn_detection",
        "invalid_value",
    ),
]


@pytest.mark.parametrize(("event", "param", "code"), HOSTILE)
async def test_malformed_duplex_events_get_an_error_and_the_session_goes_on(
    make_driver, event, param, code
) -> None:
    drv = await make_driver(duplex=True)
    await drv.send(event)
    error = (await drv.until("error"))["error"]
    assert (error["param"], error["code"]) == (param, code), error
    await drv.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
    await drv.until("response.done")  # still usable
    assert drv.session.config.duplex.model_driven is False


async def test_semantic_vad_lets_the_thinker_end_the_turn_at_its_eagerness(make_driver, engine) -> None:
    drv = await make_driver(duplex=True)
    semantic = {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}
    await drv.send({"type": "session.update", "session": {"audio": semantic, "output_modalities": ["text"]}})
    updated = await drv.until("session.updated")
    assert updated["session"]["audio"]["input"]["turn_detection"] == {
        "type": "semantic_vad",
        "eagerness": "high",
        "create_response": True,
        "interrupt_response": True,
    }
    await drv.append(silence(500))
    await drv.append(tone(700))
    await drv.append(silence(1300))  # VAD stops; no commit of its own: the thinker is asked at a pause
    stopped = await drv.until("input_audio_buffer.speech_stopped")
    speak = await drv.until("response.speak")
    reasons = [e["response"]["metadata"]["reason"] for e in drv.events if e["type"] == "response.listen"]
    assert reasons and set(reasons) <= {"no_new_input", "user_speaking"}  # 500 ms units (eagerness high)
    assert drv.events.index(stopped) < drv.events.index(speak)
    assert speak["metadata"]["unit_index"] == len(reasons)
    committed = [e for e in drv.events if e["type"] == "input_audio_buffer.committed"]
    assert len(committed) == 1 and drv.events.index(committed[0]) < drv.events.index(speak)
    assert engine.requests[0].sampling.max_tokens == 1  # the probe, before the response


async def test_semantic_vad_is_refused_outside_duplex(make_driver) -> None:
    drv = await make_driver()
    await drv.send(
        {
            "type": "session.update",
            "session": {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}},
        }
    )
    error = (await drv.until("error"))["error"]
    assert error["param"] == "session.audio.input.turn_detection.type" and "duplex" in error["message"]


async def test_a_commit_in_a_model_driven_session_lets_the_model_decide(make_driver, engine) -> None:
    drv = await model_driven(make_driver, force_listen_count=100)  # the unit clock only listens
    await drv.append(tone(300))
    await drv.send({"type": "input_audio_buffer.commit"})
    speak = await drv.until("response.speak")  # the thinker's first token is a word: it speaks
    assert speak["metadata"] == {"model_speak": True, "reason": "model_speak", "unit_index": None}
    await drv.until("response.done")
    assert engine.requests[0].sampling.max_tokens == 1

    await drv.append(tone(300))
    await drv.send({"type": "input_audio_buffer.commit", "create_response": False})
    await drv.until("input_audio_buffer.committed")
    await drv.append(tone(300))
    await drv.send({"type": "input_audio_buffer.commit", "response_create": True})
    asked = await drv.until("response.speak")
    await drv.until("response.done")
    assert asked["metadata"]["reason"] == "create_response" and len(engine.requests) == 3  # no probe
    await drv.send({"type": "input_audio_buffer.commit", "create_response": "maybe"})
    assert (await drv.until("error"))["error"]["param"] == "create_response"


async def test_a_commit_the_model_declines_is_a_listen(make_driver, engine) -> None:
    engine.reply_words = lambda request: []  # type: ignore[method-assign]
    drv = await model_driven(make_driver, force_listen_count=100)
    await drv.append(tone(300))
    await drv.send({"type": "input_audio_buffer.commit"})
    listen = await drv.until("response.listen")
    assert listen["response"]["metadata"]["model_listen"] is True
    assert "response.created" not in drv.types()
