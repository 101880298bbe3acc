"""The vLLM transcription session on the scripted engine: steps per commit, final, errors, release."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from rt_helpers import Driver, b64_pcm16, tone
from rt_scripted_engine import ScriptedEngine

from omni_runtime.contract.engine import EngineError, GenerationRequest
from omni_runtime.realtime.metrics import RealtimeMetrics
from omni_runtime.realtime.settings import RealtimeSettings
from omni_runtime.realtime.transcription.session import TranscriptionSession

RATE = 16_000


@pytest.fixture
async def make_session(engine: ScriptedEngine):
    sessions: list[TranscriptionSession] = []

    async def make(**overrides: Any) -> tuple[TranscriptionSession, Driver]:
        settings = RealtimeSettings(worker_id="w0", **overrides)
        session = TranscriptionSession(
            engine=engine, settings=settings, metrics=RealtimeMetrics(settings=settings)
        )
        sessions.append(session)
        await session.open()
        return session, Driver(session)  # type: ignore[arg-type]  # the driver only needs handle_text and outbox

    yield make
    for session in sessions:
        await session.close()


def append(ms: int) -> dict[str, Any]:
    return {"type": "input_audio_buffer.append", "audio": b64_pcm16(tone(ms, rate=RATE))}


COMMIT = {"type": "input_audio_buffer.commit"}
FINAL = {"type": "input_audio_buffer.commit", "final": True}


async def transcription(driver: Driver) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    done = await driver.until("transcription.done")
    closing = await driver.until("response.output_audio.done")
    deltas = [e["delta"] for e in driver.events[: driver.cursor] if e["type"] == "transcription.delta"]
    return deltas, done, closing


async def test_created_is_vllms_shape(make_session) -> None:
    session, driver = await make_session()
    created = await driver.until("session.created")
    assert created["id"] == session.id and isinstance(created["created"], int) and "session" not in created


async def test_commit_first_then_append_then_final(make_session, engine) -> None:
    _, driver = await make_session()
    await driver.send({"type": "session.update", "model": "scripted"})
    await driver.send(COMMIT)  # nothing buffered yet: no step, no error
    await driver.send(append(300))
    await driver.send(append(300))
    await driver.send(FINAL)
    deltas, done, closing = await transcription(driver)
    assert deltas == ["turns1", " w1", " w2", " w3"] and done["text"] == "turns1 w1 w2 w3"
    assert done["usage"] == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}
    assert closing == {
        "type": "response.output_audio.done",
        "event_id": closing["event_id"],
        "has_audio": False,
    }
    assert "error" not in driver.types()
    (request,) = engine.requests
    (turn,) = request.turns
    assert turn.role == "user" and turn.media[0].sample_rate == RATE and turn.media[0].data.size == 600 * 16
    assert request.sampling.temperature == 0.0 and not request.want_audio


async def test_each_commit_with_new_audio_is_a_step_with_what_came_before(make_session, engine) -> None:
    session, driver = await make_session()
    await driver.send(COMMIT)
    await driver.send(append(200))
    await driver.send(COMMIT)
    await driver.until("transcription.delta")
    await driver.send(append(50))
    await driver.send(COMMIT)  # under 100 ms of new audio: it waits for more
    await driver.send(append(250))
    await driver.send(FINAL)
    deltas, done, _ = await transcription(driver)
    first, second = engine.requests
    assert [t.role for t in first.turns] == ["user"] and first.turns[0].media[0].data.size == 200 * 16
    assert [t.role for t in second.turns] == ["user", "assistant", "user"]
    assert second.turns[1].text == "turns1 w1 w2 w3" and second.turns[2].media[0].data.size == 300 * 16
    assert "".join(deltas) == done["text"] == "turns1 w1 w2 w3turns3 w1 w2 w3"
    # vLLM's sums: the largest prompt, every completion token.
    assert done["usage"] == {"prompt_tokens": 30, "completion_tokens": 8, "total_tokens": 38}
    assert session.steps == 2


async def test_commits_during_a_step_are_served_together_and_appends_after_final_are_the_next_utterance(
    make_session, engine
) -> None:
    engine.step_s = 0.02
    _, driver = await make_session()
    await driver.send(append(200))
    await driver.send(COMMIT)
    await driver.until("transcription.delta")  # the first step runs; the next commits queue up
    await driver.send(append(200))
    await driver.send(COMMIT)
    await driver.send(append(200))
    await driver.send(COMMIT)
    await driver.send(FINAL)
    await driver.send(append(500))  # after final: the next utterance's audio
    _, done, _ = await transcription(driver)
    assert [r.turns[-1].media[0].data.size for r in engine.requests] == [200 * 16, 400 * 16]
    assert done["text"] == "turns1 w1 w2 w3turns3 w1 w2 w3"
    await driver.send(FINAL)
    _, second, _ = await transcription(driver)
    assert (
        second["text"] == "turns1 w1 w2 w3" and engine.requests[-1].turns[-1].media[0].data.size == 500 * 16
    )


async def test_final_without_audio_ends_with_an_empty_transcription(make_session, engine) -> None:
    _, driver = await make_session()
    await driver.send(FINAL)
    deltas, done, closing = await transcription(driver)
    assert deltas == [] and done["text"] == "" and done["usage"]["total_tokens"] == 0
    assert closing["has_audio"] is False and engine.requests == []


async def test_audio_output_as_vllm_omni_sends_it(make_session, engine) -> None:
    _, driver = await make_session()
    await driver.send({"type": "session.update", "model": "scripted", "modalities": ["text", "audio"]})
    await driver.send({"type": "session.update", "model": "scripted", "voice": "Ethan", "max_tokens": 2})
    await driver.send(append(200))
    await driver.send(FINAL)
    _, done, closing = await transcription(driver)
    audio = [e for e in driver.events if e["type"] == "response.output_audio.delta"]
    assert len(audio) == 2 and closing["has_audio"] is True and done["text"] == "turns1 w1"
    assert {(e["format"], e["sample_rate_hz"]) for e in audio} == {("pcm16", 24_000)}
    assert all(len(e["audio"]) > 0 for e in audio)
    (request,) = engine.requests
    assert request.want_audio and request.voice == "Ethan" and request.sampling.max_tokens == 2


MALFORMED = [
    ("not json", "invalid_json"),
    ('"a string"', "invalid_event"),
    ('{"type": null}', "invalid_event"),
    ('{"type": "response.create"}', "unknown_event_type"),
    ('{"type": "session.update"}', "missing_required_parameter"),
    ('{"type": "session.update", "model": 1}', "invalid_value"),
    ('{"type": "session.update", "model": "gpt-4o"}', "model_not_found"),
    ('{"type": "session.update", "model": "scripted", "modalities": "text"}', "invalid_value"),
    ('{"type": "session.update", "model": "scripted", "instructions": {}}', "invalid_value"),
    ('{"type": "session.update", "model": "scripted", "max_tokens": -1}', "invalid_value"),
    ('{"type": "session.update", "model": "scripted", "temperature": "hot"}', "invalid_value"),
    ('{"type": "session.update", "model": "scripted", "voice": "Nobody"}', "invalid_value"),
    ('{"type": "input_audio_buffer.append"}', "missing_required_parameter"),
    ('{"type": "input_audio_buffer.append", "audio": ["x"]}', "invalid_base64"),
    ('{"type": "input_audio_buffer.append", "audio": "%%%"}', "invalid_base64"),
    ('{"type": "input_audio_buffer.append", "audio": "AA=="}', "invalid_audio"),
    ('{"type": "input_audio_buffer.append", "audio": ""}', "invalid_audio"),
    ('{"type": "input_audio_buffer.commit", "final": "true"}', "invalid_value"),
    ('{"type": "input_audio_buffer.commit", "final": 1}', "invalid_value"),
]


async def test_every_malformed_event_is_an_error_event_and_the_session_goes_on(make_session, engine) -> None:
    session, driver = await make_session()
    await driver.send({"type": "session.update", "model": "scripted", "max_tokens": 2})
    await driver.send(append(200))
    for text, code in MALFORMED:
        await driver.send(text)
        error = await driver.until("error")
        assert error["code"] == code and isinstance(error["error"], str) and error["error"], text
    counted = session.metrics.errors.labels(kind="realtime", code="invalid_value")._value.get()
    assert counted == sum(code == "invalid_value" for _, code in MALFORMED) == 8
    await driver.send(FINAL)  # the audio appended before the storm is still there; the settings too
    _, done, _ = await transcription(driver)
    assert done["text"] == "turns1 w1" and engine.requests[0].turns[-1].media[0].data.size == 200 * 16


async def test_the_audio_limit_is_per_utterance(make_session) -> None:
    _, driver = await make_session(max_input_buffer_seconds=0.5)
    await driver.send(append(300))
    await driver.send(COMMIT)
    await driver.send(append(300))  # 0.6 s in this utterance
    error = await driver.until("error")
    assert (
        error["code"] == "input_audio_buffer_full"
        and error["param"] == "audio"
        and '"final": true' in error["error"]
    )
    await driver.send(FINAL)
    await transcription(driver)
    await driver.send(append(400))  # a new utterance starts from nothing
    await driver.send(FINAL)
    _, done, _ = await transcription(driver)
    assert done["text"] and "error" not in driver.types()[driver.cursor :]


class RefusingEngine(ScriptedEngine):
    """Refuses the first request the way the real engine refuses a prompt over its context."""

    def generate(self, request: GenerationRequest):
        if not self.requests:
            self.requests.append(request)
            raise EngineError("the prompt is 9000 tokens; the model's context is 4096", param="messages")
        return super().generate(request)


async def test_an_engine_refusal_is_an_error_event_and_the_next_utterance_works() -> None:
    engine = RefusingEngine()
    settings = RealtimeSettings(worker_id="w0")
    session = TranscriptionSession(
        engine=engine, settings=settings, metrics=RealtimeMetrics(settings=settings)
    )
    driver = Driver(session)  # type: ignore[arg-type]
    await driver.send(append(200))
    await driver.send(COMMIT)
    error = await driver.until("error")
    assert error["code"] == "engine_error" and "context" in error["error"]
    await driver.send(append(200))
    await driver.send(FINAL)
    _, done, _ = await transcription(driver)
    assert done["text"] == "turns1 w1 w2 w3"  # the refused audio is not in the later prompt
    assert [t.role for t in engine.requests[-1].turns] == ["user"]
    await session.close()


async def test_close_cancels_the_step_in_flight(make_session, engine) -> None:
    engine.step_s = 0.05
    session, driver = await make_session()
    await driver.send(append(200))
    await driver.send(FINAL)
    await driver.until("transcription.delta")
    await session.close()
    assert engine.cancelled == [engine.requests[0].request_id]
    # Its steps share the session's conversation KV, which the close frees.
    assert engine.requests[0].session_key == session.id and engine.ended_sessions == [session.id]
    await asyncio.sleep(0)
    assert session._runner is not None and session._runner.done()
