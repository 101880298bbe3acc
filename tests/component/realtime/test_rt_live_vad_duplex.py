"""Server VAD (silero) on espeak-ng speech and full duplex barge-in, on the real engine via the router."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from rt_client import RawRealtime

VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500}


def session_update(**session) -> dict:
    return {"type": "session.update", "session": {"type": "realtime", **session}}


def input_16k(turn_detection=VAD) -> dict:
    return {"input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": turn_detection}}


async def test_vad_detects_speech_not_silence_and_answers(live, speech_wav) -> None:
    speech = speech_wav("Please tell me a short story about the sea", "story")
    rt = await RawRealtime.connect(f"ws://{live.router_host}/v1/realtime")
    await rt.until("session.created")
    await rt.send(session_update(output_modalities=["text"], max_output_tokens=3, audio=input_16k()))
    await rt.until("session.updated")
    await rt.append_audio(np.zeros(16_000 * 2, np.float32))
    await rt.append_audio(0.01 * np.random.default_rng(0).standard_normal(16_000).astype(np.float32))
    await rt.send({"type": "conversation.item.retrieve", "item_id": "none"})  # a marker: all audio processed
    await rt.until("error")
    assert not [e for e in rt.events if e["type"].startswith("input_audio_buffer.speech")]

    await rt.append_audio(np.concatenate([speech, np.zeros(16_000, np.float32)]))
    started = await rt.until("input_audio_buffer.speech_started")
    stopped = await rt.until("input_audio_buffer.speech_stopped")
    committed = await rt.until("input_audio_buffer.committed")
    created = await rt.until("response.created")
    done = await rt.until("response.done")
    assert started["item_id"] == stopped["item_id"] == committed["item_id"]
    # espeak's speech starts after the 3 s of silence and noise; the VAD puts it there (32 ms frames).
    assert 3000 <= started["audio_start_ms"] <= 3300
    assert stopped["audio_end_ms"] - started["audio_start_ms"] >= (speech.size / 16) * 0.7
    assert rt.events.index(created) > rt.events.index(stopped)
    assert done["response"]["status"] in ("completed", "incomplete")
    await rt.close()


async def test_duplex_backchannel_barge_in_stale_epoch_and_playback_ack(live, speech_wav) -> None:
    backchannel = speech_wav("mm hmm", "backchannel")
    interruption = speech_wav("Wait, stop, I have a different question for you", "interrupt")
    assert backchannel.size / 16 < 900 and interruption.size / 16 > 1500
    rt = await RawRealtime.connect(f"ws://{live.router_host}/v1/realtime?duplex=1")
    token = (await rt.until("session.created"))["session"]["id"]
    await rt.send(
        session_update(
            output_modalities=["audio"],
            max_output_tokens=2,
            audio=input_16k(),
            duplex={"backchannel_max_ms": 1200},
        )
    )
    await rt.until("session.updated")
    await rt.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Tell me everything about whales."}],
            },
        }
    )
    await rt.send({"type": "response.create", "response": {"max_output_tokens": 60}})
    first_audio = await rt.until("response.output_audio.delta")
    response_id, item_id, epoch = first_audio["response_id"], first_audio["item_id"], first_audio["epoch"]
    await rt.send({"type": "playback.ack", "item_id": item_id, "audio_end_ms": 80})

    # A backchannel while the assistant talks: heard, not a turn, nothing cancelled.
    await rt.append_audio(np.concatenate([backchannel, np.zeros(16 * 700, np.float32)]))
    await rt.until("input_audio_buffer.speech_stopped")
    await rt.send({"type": "conversation.item.retrieve", "item_id": item_id})
    await rt.until("conversation.item.retrieved")
    assert not [e for e in rt.events if e["type"] == "response.done"]
    assert not [e for e in rt.events if e["type"] == "input_audio_buffer.committed"]

    # A real interruption: barge-in cancels at once, stale audio never arrives, history keeps the ack.
    await rt.append_audio(np.concatenate([interruption, np.zeros(16 * 700, np.float32)]))
    started = await rt.until("input_audio_buffer.speech_started")
    done = await rt.until("response.done", timeout=60)
    assert done["response"]["id"] == response_id
    assert done["response"]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
    truncated = await rt.until("conversation.item.truncated")
    assert (truncated["item_id"], truncated["audio_end_ms"]) == (item_id, 80)
    await rt.until("input_audio_buffer.committed")
    await rt.until("response.created")  # the interruption is the next turn
    await rt.until("response.done")
    # The barge-in is the overlap decision (speech past backchannel_max_ms), not the speech start:
    # deltas sent while the overlap was still undecided are not stale.
    barge = next(
        i
        for i, e in enumerate(rt.events)
        if i > rt.events.index(started) and e["type"] == "overlap.decision" and e["action"] == "barge_in"
    )
    stale = [
        e for e in rt.events[barge:] if e.get("response_id") == response_id and e["type"].endswith(".delta")
    ]
    assert stale == [], f"{len(stale)} deltas of the cancelled response after the barge-in"
    assert all(e["epoch"] > epoch for e in rt.events[barge:] if e["type"] == "response.output_audio.delta")
    await rt.send({"type": "conversation.item.retrieve", "item_id": item_id})
    item = (await rt.until("conversation.item.retrieved"))["item"]
    full = done["response"]["output"][0]["content"][0]["transcript"]
    assert len(item["content"][0]["transcript"]) < len(full) or full == ""

    # The resume token (the session id) brings a dropped client back through the router.
    last = rt.events[-1]["event_id"]
    rt.ws.transport.abort()
    again = await RawRealtime.connect(
        f"ws://{live.router_host}/v1/realtime?duplex=1&session_id={token}&last_event_id={last}"
    )
    resumed = await again.until("session.resumed")
    assert resumed["session"]["id"] == token
    await again.send({"type": "conversation.item.retrieve", "item_id": item_id})
    assert (await again.until("conversation.item.retrieved"))["item"]["id"] == item_id
    await again.close()


async def test_protocol_errors_over_the_router_leave_the_session_usable(live) -> None:
    host, _ = live.extra_worker(max_input_buffer_seconds=1.0)
    rt = await RawRealtime.connect(f"ws://{host}/v1/realtime")
    await rt.until("session.created")
    await rt.send(session_update(output_modalities=["text"], max_output_tokens=2, audio=input_16k(None)))
    await rt.until("session.updated")
    await rt.send("{malformed")
    await rt.send({"type": "input_audio_buffer.shuffle"})
    await rt.send({"type": "input_audio_buffer.append", "audio": "!!not-base64!!"})
    await rt.append_audio(np.zeros(16_000 * 2, np.float32))  # over the 1 s buffer cap
    await rt.ws.send(b"\x00\x01binary")
    codes = []
    while len(codes) < 5:
        codes.append((await rt.until("error"))["error"]["code"])
    assert codes[:4] == ["invalid_json", "unknown_event_type", "invalid_base64", "input_audio_buffer_full"]
    assert codes[4] in ("input_audio_buffer_full", "invalid_event")
    await rt.send(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "still there?"}],
            },
        }
    )
    await rt.send({"type": "response.create"})
    assert (await rt.until("response.done"))["response"]["status"] in ("completed", "incomplete")
    await rt.close()


@pytest.mark.parametrize("path", ["/v1/realtime", "/v1/video/chat/stream"])
async def test_oversize_messages_are_error_events(live, path: str) -> None:
    host, _ = live.extra_worker(max_event_bytes=4096)
    rt = await RawRealtime.connect(f"ws://{host}{path}")
    big = base64.b64encode(bytes(8192)).decode()
    await rt.send(
        {
            "type": "input_audio_buffer.append" if "realtime" in path else "audio.chunk",
            "audio": big,
            "data": big,
        }
    )
    error = await rt.until("error")
    assert error["error"]["code"] == "event_too_large"
    await rt.send(json.dumps({"type": "nope"}))
    assert (await rt.until("error"))["error"]["code"] == "unknown_event_type"
    await rt.close()
