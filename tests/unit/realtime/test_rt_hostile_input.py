"""Hostile streaming-input requests against the session logic (scripted engine): bounded work per chunk."""

from __future__ import annotations

import time

from test_rt_streaming_input import BASE, make_client, text_chunk


def test_a_far_sequence_id_is_refused_at_once_naming_the_window(engine) -> None:
    client, _ = make_client(engine, sequence_window=16)
    with client:
        session_id = client.post(BASE, json={}).json()["session_id"]
        started = time.monotonic()
        far = client.post(f"{BASE}/{session_id}/chunks", json=text_chunk(1_000_000_000, "x"))
        finished = client.post(f"{BASE}/{session_id}/finish")
        elapsed = time.monotonic() - started
    assert far.status_code == 400, far.text
    error = far.json()["error"]
    assert (error["param"], error["code"]) == ("sequence_id", "sequence_id_out_of_window")
    assert "1000000000" in error["message"] and "at most 16 ahead" in error["message"]
    assert finished.status_code == 200
    assert elapsed < 2.0


def test_the_window_moves_with_the_next_expected_id(engine) -> None:
    client, _ = make_client(engine, sequence_window=4)
    with client:
        session_id = client.post(BASE, json={}).json()["session_id"]
        codes = [
            client.post(f"{BASE}/{session_id}/chunks", json=text_chunk(seq, "x")).status_code
            for seq in (3, 4, 0, 1, 2, 4, 8, 9)
        ]
    # 3 is inside [0, 4); 4 is not until 0..2 are in; then the first gap is 5: 8 is inside, 9 is not.
    assert codes == [202, 400, 202, 202, 202, 202, 202, 400]


def test_gaps_are_counted_and_listed_only_up_to_a_hundred(engine) -> None:
    client, _ = make_client(engine, sequence_window=4096)
    with client:
        session_id = client.post(BASE, json={}).json()["session_id"]
        for seq in (0, 2, 4000):
            assert client.post(f"{BASE}/{session_id}/chunks", json=text_chunk(seq, "x")).status_code == 202
        status = client.post(f"{BASE}/{session_id}/finish").json()
    assert status["next_expected"] == 0 and status["end_sequence_id"] == 4000
    assert status["missing_count"] == 4001 - 3  # ids 0..4000, three arrived
    assert status["missing"] == [1, *range(3, 102)]
