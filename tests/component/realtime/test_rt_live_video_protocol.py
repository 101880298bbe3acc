"""Streaming video as vLLM-Omni's clients speak it, on the real engine, through the router.

The client (`video_client`) is written from the release's description. Real JPEG frames, real
16 kHz PCM16 speech (espeak-ng), the tiny random-weight checkpoint: WAV audio deltas, the audio
overflow error, per-stage sampling params, bad values refused with an error naming the field,
no leaked slot after more bad sessions than the worker's limit, back-to-back queries in order.

Both families answer a spoken query about frames with WAV audio deltas (Qwen3-Omni-MoE: its
audio and vision encoders, talker frames and Code2Wav); the rest runs on Qwen2.5-Omni.
"""

from __future__ import annotations

import asyncio
import base64
import re

import httpx
import numpy as np
from video_client import Response, VideoStreamClient, jpeg_frame, pcm16

URL = "/v1/video/chat/stream"


async def _client(live) -> VideoStreamClient:
    return await VideoStreamClient.connect(f"ws://{live.router_host}{URL}")


async def _live_video_sessions(live) -> float:
    async with httpx.AsyncClient(base_url=f"http://{live.worker_host}") as client:
        text = (await client.get("/metrics")).text
    match = re.search(r'^omni_realtime_sessions\{kind="video"\} (\S+)$', text, re.MULTILINE)
    assert match, "the live-session gauge is missing from /metrics"
    return float(match.group(1))


async def _speak(live, speech, *, talker: dict) -> tuple[dict, Response]:
    """One spoken query about three frames: its response.done and the whole response."""
    video = await _client(live)
    await video.config(
        modalities=["text", "audio"],
        num_frames=2,
        sampling_params_list=[
            {"max_tokens": 3, "temperature": 0.0, "ignore_eos": True},
            {"temperature": 0.0, "top_k": 1, **talker},
            {"temperature": 0.0, "detokenize": True},
        ],
    )
    for step in range(3):
        await video.frame(jpeg_frame(step))
    await video.audio(pcm16(speech))
    await video.query("Describe it.")
    await video.collect("response.done")
    await video.finish()
    assert not video.errors(), video.errors()
    (response,) = video.responses()
    return response.of("response.done")[0], response


async def test_audio_deltas_are_wav_files_under_both_names(family_live, speech_wav) -> None:
    live = family_live
    speech = speech_wav("What is moving in the picture?", "video-question")
    done, response = await _speak(live, speech, talker={"max_tokens": 8})
    wavs = response.wavs("response.audio.delta")  # the name REFERENCE.md gives
    assert done["status"] == "completed"
    assert wavs and {rate for rate, _ in wavs} == {live.engine.output_sample_rate}
    released = response.wavs("response.output_audio.delta")  # vLLM-Omni 0.30's name, same files
    assert [pcm.tobytes() for _, pcm in released] == [pcm.tobytes() for _, pcm in wavs]
    assert response.of("response.output_audio.done") and response.of("response.audio.done")


async def test_each_sampling_params_list_entry_reaches_its_stage(live, speech_wav) -> None:
    speech = speech_wav("What is moving in the picture?", "video-question")
    samples = []
    for talker_tokens in (4, 32):
        done, response = await _speak(live, speech, talker={"max_tokens": talker_tokens})
        assert done["usage"]["completion_tokens"] == 3  # entry 0 is the thinker's
        samples.append(sum(_pcm_samples(event) for event in response.of("response.audio.delta")))
    # entry 1 is the talker's: its codec-token budget bounds the speech (each code is a fixed
    # number of samples), where the default budget would allow 30 codes per text token
    per_code = live.engine.stages.local.vocoder.samples_per_code
    assert 0 < samples[0] <= 4 * per_code < samples[1] <= 32 * per_code, (samples, per_code)


def _pcm_samples(event: dict) -> int:
    """Samples in one audio delta, whatever its framing (a WAV file or raw PCM16)."""
    data = base64.b64decode(event["data"])
    return (len(data) - 44 if data[:4] == b"RIFF" else len(data)) // 2


async def test_audio_overflow_is_an_error_and_clears_the_buffer(live, speech_wav) -> None:
    cap_s = live.realtime.settings.max_video_audio_seconds
    video = await _client(live)
    await video.config(modalities=["text"], sampling_params_list=[{"max_tokens": 2, "temperature": 0.0}])
    await video.frame(jpeg_frame(0))
    piece = pcm16(0.05 * np.sin(np.arange(500_000) / 7.0))  # 31.25 s of a hum per chunk
    pieces = int(cap_s // 31.25) + 1  # the last one passes the cap
    for _ in range(pieces):
        await video.audio(piece)
    (overflow,) = await video.collect("error")
    assert overflow["error"]["code"] == "audio_buffer_full" and overflow["error"]["param"] == "data"
    assert "dropped" in overflow["message"]
    speech = speech_wav("Hello there.", "video-after-overflow")
    await video.audio(pcm16(speech))
    await video.query("What did I say?")
    (start,) = await video.collect("response.start")
    assert start["stats"]["audio_buffered_s"] == round(speech.size / 16_000, 3)  # the hum is gone
    await video.finish()
    assert len(video.errors()) == 1


async def test_bad_sampling_values_are_errors_naming_the_field(live) -> None:
    video = await _client(live)
    await video.config(modalities=["text"], sampling_params_list=[{"max_tokens": "abc"}])
    await video.config(modalities=["text"], sampling_params_list=[{"max_tokens": 2}, {"temperature": "hot"}])
    await video.frame(jpeg_frame(1))
    await video.send({"type": "video.query", "text": "hi", "sampling_params_list": [{"temperature": "hot"}]})
    await video.config(modalities=["text"], sampling_params_list=[{"max_tokens": 2, "temperature": 0.0}])
    await video.query("What is in the picture?")
    await video.collect("response.text.done")
    await video.finish()
    assert [(e["error"]["param"], e["error"]["code"]) for e in video.errors()] == [
        ("sampling_params_list[0].max_tokens", "invalid_value"),
        ("sampling_params_list[1].temperature", "invalid_value"),
        ("sampling_params_list[0].temperature", "invalid_value"),
    ]
    assert "'abc'" in video.errors()[0]["message"]
    (response,) = video.responses()
    assert response.of("response.done")[0]["status"] == "completed"
    assert response.of("response.done")[0]["usage"]["completion_tokens"] <= 2


async def test_more_bad_sessions_than_the_limit_leak_no_slot(live) -> None:
    limit = live.realtime.settings.max_video_sessions
    for index in range(limit + 1):
        bad = {"max_tokens": "abc"} if index % 2 else {"temperature": "hot"}
        video = await _client(live)
        await video.config(modalities=["text"], sampling_params_list=[bad])
        await video.frame(jpeg_frame(index % 4))
        await video.send({"type": "video.query", "text": "What is there?", "sampling_params_list": [bad]})
        await video.finish(timeout=30)  # session.done arrives: nothing hangs
        assert len(video.errors()) == 2 and all(
            e["error"]["param"] == f"sampling_params_list[0].{next(iter(bad))}" for e in video.errors()
        )
    good = await _client(live)
    await good.config(modalities=["text"], sampling_params_list=[{"max_tokens": 2, "temperature": 0.0}])
    await good.frame(jpeg_frame(2))
    await good.query("What is there?")
    (done,) = await good.collect("response.done")
    assert done["status"] == "completed" and not good.errors()
    await good.finish()
    deadline = asyncio.get_running_loop().time() + 10
    while await _live_video_sessions(live) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.1)
    assert await _live_video_sessions(live) == 0


async def test_back_to_back_queries_are_answered_in_order_each_with_its_own_response(live) -> None:
    video = await _client(live)
    await video.config(modalities=["text"], sampling_params_list=[{"max_tokens": 3, "temperature": 0.0}])
    for step in range(2):
        await video.frame(jpeg_frame(step))
    questions = ["Where is the ball?", "What colour is it?", "Is it moving?"]
    await asyncio.gather(*(video.query(q) for q in questions))  # no wait between them
    await video.collect("response.done", count=len(questions))
    await video.finish()
    assert not video.errors()
    responses = video.responses()
    assert len(responses) == len(questions)
    ids = [r.events[0]["response_id"] for r in responses]
    assert len(set(ids)) == len(questions)
    for response, response_id in zip(responses, ids, strict=True):
        # every event of a response carries its id (none of another response interleaves) and
        # the response ends before the next one starts
        assert {e["response_id"] for e in response.events} == {response_id}
        assert [e["type"] for e in response.events][-2:] == ["response.text.done", "response.done"]
        assert response.of("response.text.done")[0]["text"] == response.text
        assert response.of("response.done")[0]["status"] == "completed"


async def test_a_session_outgrowing_the_context_keeps_answering_on_its_recent_turns(live) -> None:
    tokens_per_100 = len(live.engine.adapter.tokenizer(" apple" * 100).input_ids)
    words = int(0.55 * live.engine.max_model_len * 100 / tokens_per_100)  # two such questions do not fit
    video = await _client(live)
    await video.config(modalities=["text"], sampling_params_list=[{"max_tokens": 2, "temperature": 0.0}])
    for index in range(3):
        await video.query(f"Question {index}:" + " apple" * words)
    done = await video.collect("response.done", count=3, timeout=300)
    await video.finish()
    assert not video.errors(), video.errors()
    assert [d["status"] for d in done] == ["completed"] * 3
    prompts = [d["usage"]["prompt_tokens"] for d in done]
    assert max(prompts) < live.engine.max_model_len and prompts[1] == prompts[2], prompts
