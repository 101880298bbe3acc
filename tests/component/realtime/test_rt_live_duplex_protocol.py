"""Full duplex as MiniCPM-o-style clients speak it, on the real engine through the router.

The client (`duplex_client.py`) is written from the published description of vLLM-Omni's duplex
lane. Each test is one thing such a client needs: the native socket, the unit pair clock, playback
acknowledgements deciding history, and model-driven listen/speak.

Qwen3-Omni-MoE runs one case of three tables (on /v1/duplex): audio units with their transcript,
a barge-in over a finished reply, and model-driven listen/speak (its thinker answers the probe);
every case runs on Qwen2.5-Omni.
"""

from __future__ import annotations

import re

import httpx
import numpy as np
import pytest
from duplex_client import AUDIO_DELTAS, TRANSCRIPT_DELTAS, DuplexClient

TEXT_TURN = {
    "type": "conversation.item.create",
    "item": {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Tell me everything about whales."}],
    },
}


def probes(worker_host: str) -> float:
    """How many listen/speak probes the worker's thinker answered (its /metrics)."""
    text = httpx.get(f"http://{worker_host}/metrics", timeout=10).text
    return sum(
        float(v) for v in re.findall(r"^omni_realtime_duplex_probes_total\{[^}]*\} (\S+)$", text, re.M)
    )


NATIVE = ("/v1/duplex", "response.audio.delta", "response.audio_transcript.delta", "response.audio.done")


@pytest.mark.parametrize(
    ("family", "path", "audio", "transcript", "done"),
    [
        ("qwen2_5_omni", *NATIVE),
        (
            "qwen2_5_omni",
            "/v1/realtime?duplex=1",
            "response.output_audio.delta",
            "response.output_audio_transcript.delta",
            "response.output_audio.done",
        ),
        ("qwen3_omni_moe", *NATIVE),
    ],
)
async def test_duplex_sockets_send_audio_units_with_their_transcript(
    live_of, family, path, audio, transcript, done
) -> None:
    live = live_of(family)
    client = await DuplexClient.connect(f"ws://{live.router_host}{path}")
    created = await client.next_of("session.created")
    assert "duplex" in created["session"]
    await client.configure(output_modalities=["audio"])
    await client.send(TEXT_TURN)
    await client.send({"type": "response.create", "response": {"max_output_tokens": 12}})
    finished = await client.next_of("response.done")
    response_id = finished["response"]["id"]
    names = {e["type"] for e in client.events}
    assert {audio, transcript, done} <= names
    other = {n for n in (*AUDIO_DELTAS, *TRANSCRIPT_DELTAS) if n not in (audio, transcript)}
    assert not names & other, f"mixed dialects: {names & other}"
    units = client.units(response_id)  # raises if an audio delta lacks its transcript delta
    assert units and all(u.audio_ms > 0 for u in units)
    text_deltas = [e["delta"] for e in client.of_type(transcript) if e["response_id"] == response_id]
    assert len(text_deltas) in (len(units), len(units) + 1)  # one per unit, plus text after the last audio
    assert "".join(text_deltas) == finished["response"]["output"][0]["content"][0]["transcript"]
    await client.close()


@pytest.mark.parametrize("path", ["/v1/duplex", "/v1/realtime?duplex=1"])
async def test_playback_ack_decides_history_on_response_cancel(path, live) -> None:
    client = await DuplexClient.connect(f"ws://{live.router_host}{path}")
    await client.next_of("session.created")
    await client.configure(output_modalities=["audio"])
    await client.send(TEXT_TURN)
    await client.send({"type": "response.create", "response": {"max_output_tokens": 80}})
    first = await client.next_of(*AUDIO_DELTAS)
    await client.ack(first["response_id"], 40)
    acknowledged = await client.next_of("playback.acknowledged")
    assert (acknowledged["item_id"], acknowledged["played_ms"]) == (first["item_id"], 40)
    await client.send({"type": "response.cancel"})
    finished = await client.next_of("response.done")
    assert finished["response"]["status"] == "cancelled"
    truncated = await client.next_of("conversation.item.truncated")
    assert (truncated["item_id"], truncated["audio_end_ms"]) == (first["item_id"], 40)
    await client.send({"type": "conversation.item.retrieve", "item_id": first["item_id"]})
    kept = (await client.next_of("conversation.item.retrieved"))["item"]["content"][0]["transcript"]
    full = finished["response"]["output"][0]["content"][0]["transcript"]
    assert len(kept) < len(full) or full == ""
    await client.close()


@pytest.mark.parametrize(
    ("family", "path"),
    [
        ("qwen2_5_omni", "/v1/duplex"),
        ("qwen2_5_omni", "/v1/realtime?duplex=1"),
        ("qwen3_omni_moe", "/v1/duplex"),
    ],
)
async def test_speech_over_a_finished_reply_is_a_barge_in_trimmed_to_the_ack(
    family, path, live_of, speech_wav
) -> None:
    live = live_of(family)
    interruption = speech_wav("Wait, stop, I have a different question for you", "interrupt")
    client = await DuplexClient.connect(f"ws://{live.router_host}{path}")
    await client.next_of("session.created")
    await client.configure(output_modalities=["audio"], max_output_tokens=4)
    await client.send(TEXT_TURN)
    # The tiny random talker samples its codes and can draw its end code within the first frame
    # (once in this session's two make-test runs, on Qwen3): ask again until a reply is long enough.
    for _ in range(3):
        await client.send({"type": "response.create", "response": {"max_output_tokens": 16}})
        finished = await client.next_of("response.done")
        response_id, item = finished["response"]["id"], finished["response"]["output"][0]
        total = client.audio_ms(response_id)
        assert finished["response"]["status"] in ("completed", "incomplete")
        if total > 200:
            break
    assert total > 200, f"three replies of the tiny talker all ended within {total:.0f} ms of audio"
    await client.ack(response_id, 120)  # the reply is generated; the client has played 120 ms of it

    await client.stream(np.concatenate([interruption, np.zeros(16 * 800, np.float32)]))
    decision = await client.next_of("overlap.decision", action="barge_in")
    truncated = await client.next_of("conversation.item.truncated")
    assert (truncated["item_id"], truncated["audio_end_ms"]) == (item["id"], 120)
    await client.next_of("input_audio_buffer.committed")
    nxt = await client.next_of("response.created")  # the interruption is the next turn
    assert nxt["response"]["id"] != response_id and decision["reason"] == "long_speech"
    await client.next_of("response.done")
    await client.send({"type": "conversation.item.retrieve", "item_id": item["id"]})
    kept = (await client.next_of("conversation.item.retrieved"))["item"]["content"][0]["transcript"]
    assert len(kept) < len(item["content"][0]["transcript"]) or not item["content"][0]["transcript"]
    await client.close()


SEMANTIC = {
    "input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": {"type": "semantic_vad"}}
}


AUTO = {"extra_body": {"auto_response": True, "force_listen_count": 2}}


@pytest.mark.parametrize(
    ("family", "path", "fields"),
    [
        ("qwen2_5_omni", "/v1/duplex", AUTO),
        ("qwen2_5_omni", "/v1/realtime?duplex=1", AUTO),
        (
            "qwen2_5_omni",
            "/v1/duplex",
            {"audio": SEMANTIC, "duplex": {"force_listen_count": 2}},
        ),  # VAD hears, the model ends turns
        ("qwen3_omni_moe", "/v1/duplex", AUTO),
    ],
)
async def test_model_driven_duplex_listens_first_then_the_model_decides(
    family, path, fields, live_of, speech_wav
) -> None:
    live = live_of(family)
    speech = speech_wav("Hello there, can you tell me what time it is", "question")
    before = probes(live.worker_host)
    client = await DuplexClient.connect(f"ws://{live.router_host}{path}")
    await client.next_of("session.created")
    updated = await client.configure(output_modalities=["audio"], max_output_tokens=4, **fields)
    assert updated["session"]["duplex"]["auto_response"] is ("extra_body" in fields)
    assert updated["session"]["duplex"]["force_listen_count"] == 2

    await client.stream(0.01 * np.random.default_rng(1).standard_normal(16_000 * 2).astype(np.float32))
    forced = [await client.next_of("response.listen") for _ in range(2)]
    assert [f["response"]["metadata"]["unit_index"] for f in forced] == [0, 1]
    assert all(f["response"]["metadata"]["reason"] == "force_listen_count" for f in forced)
    assert all(
        f["response"]["metadata"]["force_listen"] and f["response"]["status"] == "listening" for f in forced
    )

    await client.stream(np.concatenate([speech, np.zeros(16_000 * 3, np.float32)]))
    # Units while the user talks listen; once they pause the thinker chooses.
    while True:
        event = await client.next_of("response.speak", "response.listen", timeout=180)
        if event["type"] == "response.speak" or event["response"]["metadata"]["reason"] == "model_listen":
            choice = event
            break
        assert event["response"]["metadata"]["reason"] in ("user_speaking", "no_new_input")
    assert probes(live.worker_host) > before  # the choice was the served model's
    assert not [e for e in client.events[: client.events.index(choice)] if e["type"] == "response.created"]
    if choice["type"] == "response.speak":
        committed = client.of_type("input_audio_buffer.committed")
        assert committed and client.events.index(committed[-1]) < client.events.index(choice)
        created = await client.next_of("response.created")
        assert created["response"]["id"] == choice["response_id"]
        await client.next_of("response.done")
    else:
        assert choice["response"]["metadata"]["model_listen"] is True
    await client.close()


async def test_model_driven_without_vad_and_force_barge_in(live) -> None:
    client = await DuplexClient.connect(f"ws://{live.router_host}/v1/duplex")
    await client.next_of("session.created")
    no_vad = {"input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}}
    await client.send({"type": "session.update", "session": {"audio": no_vad}})
    refused = await client.next_of("error")
    assert refused["error"]["param"] == "session.audio.input.turn_detection"
    assert "auto_response" in refused["error"]["message"]

    await client.configure(output_modalities=["audio"], audio=no_vad, full_duplex=True)
    await client.send(TEXT_TURN)
    await client.send({"type": "response.create", "response": {"max_output_tokens": 80}})
    first = await client.next_of("response.audio.delta")
    # 100 ms is far below any backchannel limit, and there is no VAD: only the hint can stop it.
    await client.stream(np.zeros(1600, np.float32), force_barge_in=True)
    decision = await client.next_of("overlap.decision")
    assert (decision["action"], decision["reason"]) == ("barge_in", "force_barge_in")
    finished = await client.next_of("response.done")
    assert finished["response"]["id"] == first["response_id"]
    assert finished["response"]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
    await client.stream(np.zeros(1600, np.float32), force_barge_in="yes")
    bad = await client.next_of("error")
    assert bad["error"]["param"] == "force_barge_in"
    await client.close()


@pytest.mark.parametrize(("query", "duplex"), [("", True), ("?duplex=1", True), ("?duplex=0", False)])
async def test_a_duplex_worker_opens_duplex_realtime_sessions(family_live, query: str, duplex: bool) -> None:
    """`omni serve --pipeline duplex`: /v1/realtime sessions are full duplex unless the client asks
    ?duplex=0, and a duplex session answers with audio units as on /v1/duplex."""
    host, _ = family_live.extra_worker(duplex_by_default=True)
    client = await DuplexClient.connect(f"ws://{host}/v1/realtime{query}")
    created = await client.next_of("session.created")
    assert ("duplex" in created["session"]) is duplex
    if duplex:
        await client.configure(output_modalities=["audio"])
        await client.send(TEXT_TURN)
        await client.send({"type": "response.create", "response": {"max_output_tokens": 8}})
        finished = await client.next_of("response.done")
        assert client.units(finished["response"]["id"]), "a duplex reply is sent as audio units"
    await client.close()
