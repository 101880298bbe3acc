"""Streaming-input chunk rules as tables: how a chunk is placed and what its modality is, and
offset addressing (out of order, duplicates, a finish that waits for the gap) on a session."""

from __future__ import annotations

import base64

import pydantic
import pytest
from test_rt_streaming_input import BASE, make_client, png

from omni_runtime.realtime.streaming_input.models import Chunk, infer_modality

WAV = b"RIFF\x24\x00\x00\x00WAVEfmt "
WEBP = b"RIFF\x24\x00\x00\x00WEBPVP8 "


@pytest.mark.parametrize(
    ("fields", "raw", "modality"),
    [
        ({"modality": "video"}, png(1), "video"),  # named: as named
        ({"modality": "audio"}, png(1), "audio"),
        ({"text": "hi"}, b"hi", "text"),
        ({}, png(1), "image"),
        ({}, b"\xff\xd8\xff\xe0rest", "image"),  # JPEG
        ({}, b"GIF89a...", "image"),
        ({}, WEBP, "image"),
        ({}, WAV, "audio"),  # RIFF but not WebP: bytes as PCM16
        ({}, b"\x00\x01\x02\x03", "audio"),
    ],
)
def test_infer_modality(fields: dict, raw: bytes, modality: str) -> None:
    chunk = Chunk.model_validate({"sequence_id": 0, **fields})
    assert infer_modality(chunk, raw) == modality


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"sequence_id": 0, "offset": 0, "text": "a"}, "sequence_id or by offset, not both"),
        ({"text": "a"}, "needs sequence_id"),
        ({"sequence_id": 0, "text": "a", "payload": "YQ=="}, "either text or a base64 payload"),
        ({"offset": -1, "text": "a"}, "greater than or equal to 0"),
        ({"sequence_id": 0, "modality": "smell", "text": "a"}, "Input should be"),
        ({"end_of_input": True}, None),  # an end marker needs no place
        ({"offset": 7, "payload": "YQ=="}, None),
        ({"sequence_id": 3, "payload": "YQ=="}, None),
    ],
)
def test_chunk_placement(body: dict, error: str | None) -> None:
    if error is None:
        chunk = Chunk.model_validate(body)
        assert chunk.end_marker == (body == {"end_of_input": True})
        return
    with pytest.raises(pydantic.ValidationError) as caught:
        Chunk.model_validate(body)
    assert error in str(caught.value)


def text_at(offset: int, text: str, **extra: object) -> dict:
    payload = base64.b64encode(text.encode()).decode()
    return {"offset": offset, "modality": "text", "payload": payload, **extra}


def test_offsets_out_of_order_and_a_finish_that_waits_for_the_gap(engine) -> None:
    client, _ = make_client(engine)
    with client:
        session_id = client.post(BASE, json={}).json()["session_id"]
        url = f"{BASE}/{session_id}"
        assert client.patch(url, json=text_at(5, "world")).json()["next_offset"] == 0
        finish = client.post(f"{url}/finish").json()
        assert (finish["status"], finish["next_offset"]) == ("collecting", 0)  # bytes 0..4 missing
        inside = client.post(f"{url}/append", json=text_at(2, "x"))
        assert inside.status_code == 202  # a chunk waiting for the gap, too
        overlap = client.post(f"{url}/append", json=text_at(0, "hel"))  # 0..3 covers 'x' at 2
        assert (
            overlap.status_code == 400
            and "overlap the chunk at offset 2" in overlap.json()["error"]["message"]
        )
        assert client.post(f"{url}/chunks", json=text_at(0, "he")).json()["next_offset"] == 3  # 'x' joined
        below = client.post(f"{url}/append", json=text_at(1, "zz"))
        assert below.status_code == 400 and below.json()["error"]["param"] == "offset"
        again = client.post(f"{url}/append", json=text_at(2, "x"))
        assert again.status_code == 200 and again.json()["duplicate"] is True
        mixed = client.post(f"{url}/chunks", json={"sequence_id": 0, "text": "no"})
        assert mixed.status_code == 400 and mixed.json()["error"]["param"] == "sequence_id"
        done = client.post(f"{url}/append", json=text_at(3, "lo"))
        assert done.status_code == 202 and done.json()["next_offset"] == 10
        result = client.get(f"{url}/result").json()
        assert result["object"] == "chat.completion"
        assert client.get(url).json()["status"] == "done"  # the earlier finish took effect
    assert engine.requests[0].turns[0].text == "hexloworld"
