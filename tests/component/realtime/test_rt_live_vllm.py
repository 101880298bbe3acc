"""vLLM-Omni's session-based realtime flow on /v1/realtime, on the real engine, through the router.

The client (`vllm_client`) is written from the released vLLM server's protocol; the audio is real
16 kHz speech made by espeak-ng. Each test is one way such a client used to break here: the flat
``session.update`` was refused, the opening commit was "empty", 16 kHz was read as 24 kHz, no
``transcription.*`` events came, and ``final: true`` was ignored.

Both families run the released client's flow (audio in through the family's audio encoder), its
error events, the 16 kHz reading, output streamed per commit, and audio output; the dialects side
by side run on Qwen2.5-Omni.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time

import httpx
import soundfile as sf
from openai import AsyncOpenAI
from vllm_client import RATE, VllmRealtimeClient


def url(live, query: str = "") -> str:
    return f"ws://{live.router_host}/v1/realtime{query}"


async def live_sessions(live) -> float:
    async with httpx.AsyncClient(base_url=f"http://{live.worker_host}") as client:
        text = (await client.get("/metrics")).text
    line = next(
        line for line in text.splitlines() if line.startswith('omni_realtime_sessions{kind="realtime"}')
    )
    return float(line.split()[-1])


async def until_no_sessions(live, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while await live_sessions(live) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert await live_sessions(live) == 0


async def test_released_client_flow_commit_append_final(family_live, speech_wav) -> None:
    """session.update (flat) -> commit -> appends -> commit final -> deltas and done with usage."""
    live = family_live
    speech = speech_wav("Tell me about the weather today", "weather")
    client = await VllmRealtimeClient.connect(url(live))
    assert client.session_id.startswith("rt_tiny-w0.") and isinstance(client.created["created"], int)
    await client.update(live.engine.model_name)
    await client.commit()  # starts the stream: nothing is buffered yet, and that is fine
    await client.append(speech)
    await client.commit(final=True)
    result = await client.transcription()
    assert not client.errors
    assert result.deltas and "".join(result.deltas) == result.text
    usage = result.usage
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert result.has_audio is False and not result.audio  # text only unless the session asks

    # The session goes on: a second utterance is its own transcription.
    await client.commit()
    await client.append(speech[: RATE // 2])
    await client.commit(final=True)
    second = await client.transcription()
    assert second.text and "".join(second.deltas) == second.text
    assert second.usage["prompt_tokens"] < usage["prompt_tokens"]  # half a second of audio, fresh prompt
    await client.close()
    await until_no_sessions(live)


async def test_a_wrong_model_or_malformed_event_is_an_error_event_and_the_session_goes_on(
    family_live, speech_wav
) -> None:
    live = family_live
    client = await VllmRealtimeClient.connect(url(live, "?protocol=vllm"))
    await client.update("no-such-model")
    error = await client.next_error()
    assert error["code"] == "model_not_found" and "no-such-model" in error["error"]
    for bad, code in (
        ({"type": "input_audio_buffer.append", "audio": "not base64!"}, "invalid_base64"),
        ({"type": "input_audio_buffer.append", "audio": ""}, "invalid_audio"),
        ({"type": "input_audio_buffer.commit", "final": "yes"}, "invalid_value"),
        ({"type": "session.update"}, "missing_required_parameter"),
        ({"type": "response.create"}, "unknown_event_type"),
    ):
        await client.send(bad)
        error = await client.next_error()
        assert error["code"] == code and isinstance(error["error"], str)
    await client.update(live.engine.model_name, max_tokens=4)
    await client.commit()
    await client.append(speech_wav("Hello", "hello"))
    await client.commit(final=True)
    result = await client.transcription()
    assert result.text and not client.errors and 1 <= result.usage["completion_tokens"] <= 4
    await client.close()
    await until_no_sessions(live)


async def test_audio_is_read_at_16_khz(family_live, speech_wav) -> None:
    """The prompt of one second of 16 kHz audio equals that of the same second sent as a WAV file."""
    live = family_live
    speech = speech_wav("One two three four five six seven", "count")[: 2 * RATE]
    client = await VllmRealtimeClient.connect(url(live))
    await client.update(live.engine.model_name, max_tokens=1)
    await client.commit()
    await client.append(speech)
    await client.commit(final=True)
    streamed = (await client.transcription()).usage["prompt_tokens"]
    await client.close()

    wav = io.BytesIO()
    sf.write(wav, speech, RATE, format="WAV", subtype="PCM_16")
    audio = {"data": base64.b64encode(wav.getvalue()).decode(), "format": "wav"}
    chat = AsyncOpenAI(base_url=f"http://{live.router_host}/v1", api_key="unused")
    reply = await chat.chat.completions.create(
        model=live.engine.model_name,
        messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": audio}]}],
        max_tokens=1,
    )
    assert reply.usage is not None and streamed == reply.usage.prompt_tokens


async def test_commits_stream_output_as_audio_arrives_and_final_ends_it(family_live, speech_wav) -> None:
    """Each commit with new audio answers it with the earlier audio and answers as context."""
    live = family_live
    part1, part2 = speech_wav("What time is it", "time"), speech_wav("in Paris", "paris")
    client = await VllmRealtimeClient.connect(url(live))
    await client.update(live.engine.model_name, max_tokens=3)
    await client.commit()
    await client.append(part1)
    await client.commit()
    first = await client.next_event(timeout=240)
    assert first["type"] == "transcription.delta"  # output before the input ended
    await client.append(part2)
    await client.commit(final=True)
    result = await client.transcription()
    assert result.text.startswith(first["delta"]) and "".join([first["delta"], *result.deltas]) == result.text
    assert live.realtime.sessions.get(client.session_id).steps == 2
    assert 2 <= result.usage["completion_tokens"] <= 6  # two steps of one to three tokens
    await client.close()


async def test_audio_output_as_vllm_omni_sends_it(family_live, speech_wav) -> None:
    live = family_live
    client = await VllmRealtimeClient.connect(url(live, "?protocol=vllm"))
    assert set(client.created) >= {"type", "id", "created"} and "session" not in client.created
    await client.append(speech_wav("Say something", "say"))  # before the first commit: kept
    await client.update(live.engine.model_name, modalities=["text", "audio"], max_tokens=4)
    await client.commit(final=True)
    result = await client.transcription()
    assert result.has_audio is True and result.audio and len(result.audio) % 2 == 0
    assert result.sample_rates == {live.engine.output_sample_rate}
    await client.close()
    await until_no_sessions(live)


async def test_both_dialects_on_one_endpoint_at_once(live, speech_wav) -> None:
    speech = speech_wav("Good morning", "morning")
    vllm_client = await VllmRealtimeClient.connect(url(live))
    openai = AsyncOpenAI(base_url=f"http://{live.router_host}/v1", api_key="unused")
    async with openai.realtime.connect(model=live.engine.model_name) as conn:
        created = await conn.recv()
        assert created.type == "session.created" and created.session.id
        await vllm_client.update(live.engine.model_name, max_tokens=2)
        await conn.session.update(
            session={"type": "realtime", "output_modalities": ["text"], "max_output_tokens": 2}
        )
        await vllm_client.commit()
        await vllm_client.append(speech)
        await vllm_client.commit(final=True)
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
        )
        await conn.response.create()
        async for event in conn:
            if event.type == "response.done":
                assert event.response.status in ("completed", "incomplete")
                break
        result = await vllm_client.transcription()
        assert result.text and not vllm_client.errors
        assert await live_sessions(live) == 2
    await vllm_client.close()
    await until_no_sessions(live)
