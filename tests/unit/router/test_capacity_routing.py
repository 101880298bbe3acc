"""The router's reading of a worker at speech capacity, and where the refused request goes next."""

from __future__ import annotations

import pytest

from omni_runtime.router.binding import Binding, BindKind, capacity_refused, rank_by_load, retry_candidate
from omni_runtime.router.table import WorkerTable, speech_full

SPEECH = (b"x-omni-capacity", b"speech")
JSON = (b"content-type", b"application/json")


@pytest.mark.parametrize(
    ("status", "headers", "refused"),
    [
        (429, [JSON, SPEECH], True),
        (429, [JSON, (b"x-omni-capacity", b" speech ")], True),
        (429, [JSON], False),  # another 429 (e.g. the realtime session limit) is the client's to see
        (429, [(b"x-omni-capacity", b"video")], False),
        (200, [SPEECH], False),  # only a refusal moves a request
        (503, [SPEECH], False),
        (None, [SPEECH], True),  # a WebSocket handshake: the header alone says it
        (None, [], False),
    ],
)
def test_capacity_refused(status: int | None, headers: list[tuple[bytes, bytes]], refused: bool) -> None:
    assert capacity_refused(headers, status=status) is refused


@pytest.mark.parametrize(
    ("kind", "tried", "down", "expected"),
    [
        (BindKind.LEAST_LOADED, ["w0"], [], "w1"),  # the full worker is passed over
        (BindKind.LEAST_LOADED, ["w0", "w1"], [], "w2"),  # each candidate at most once
        (BindKind.LEAST_LOADED, ["w0", "w1", "w2"], [], None),  # all full: the refusal goes out
        (BindKind.LEAST_LOADED, ["w0"], ["w1"], "w2"),  # only workers still in rotation
        (BindKind.KEY, ["w1"], [], "w0"),  # a session key's next rank
        (BindKind.SESSION, ["w0"], [], None),  # a bound session never moves
    ],
)
def test_where_a_refused_request_goes(
    ready3: WorkerTable, kind: BindKind, tried: list[str], down: list[str], expected: str | None
) -> None:
    candidates = ("w1", "w0", "w2") if kind is BindKind.KEY else ("w0", "w1", "w2")
    if kind is BindKind.SESSION:
        candidates = ("w0",)
    for worker_id in down:
        ready3.set_health(worker_id, False)
    binding = Binding(kind=kind, candidates=candidates)
    assert retry_candidate(binding, failed=tried, table=ready3) == expected


@pytest.mark.parametrize(
    ("body", "full"),
    [
        ({"status": "ready", "speech_streams": {"limit": 4, "in_use": 4}}, True),
        ({"status": "ready", "speech_streams": {"limit": 4, "in_use": 3}}, False),
        ({"status": "ready", "speech_streams": {"limit": 0, "in_use": 50}}, False),  # 0: no limit
        ({"status": "ready", "model": "m"}, False),  # a text worker, a peer runtime: no report
        ({"speech_streams": {"limit": "4", "in_use": 9}}, False),  # malformed: not trusted
        ({"speech_streams": {"limit": True, "in_use": 9}}, False),
        ({"speech_streams": [4, 4]}, False),
        (["ready"], False),
        (None, False),
    ],
)
def test_speech_full_from_the_ready_report(body: object, full: bool) -> None:
    assert speech_full(body) is full


def test_least_loaded_ranks_workers_without_free_speech_streams_last(ready3: WorkerTable) -> None:
    ready3.open_session("w1")
    ready3.set_speech_full("w0", True)
    assert rank_by_load(ready3.in_rotation()) == ["w2", "w1", "w0"]  # w0 idle but full
    ready3.set_speech_full("w0", False)
    assert rank_by_load(ready3.in_rotation()) == ["w0", "w2", "w1"]
    ready3.set_speech_full("unknown", True)  # a worker that left the table: ignored
