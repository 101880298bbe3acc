"""Where requests go: session ids pin, keys hash consistently, the rest go least-loaded."""

from __future__ import annotations

import pytest

from omni_runtime.contract.sessions import make_session_id
from omni_runtime.router.binding import Binding, BindKind, bind, rank_by_key, rank_by_load, retry_candidate
from omni_runtime.router.errors import RouterError
from omni_runtime.router.table import WorkerState, WorkerTable

HEADER = "X-Session-Id"


def route(table: WorkerTable, path: str = "/v1/chat/completions", *, query=None, headers=None) -> Binding:
    return bind(table, path=path, query=query or {}, headers=headers or {}, session_header=HEADER)


# ---- rendezvous hashing --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("alice", ["w2", "w0", "w1"]),
        ("bob", ["w1", "w2", "w0"]),
        ("carol", ["w2", "w1", "w0"]),
        ("dave", ["w2", "w0", "w1"]),
        ("erin", ["w1", "w0", "w2"]),
    ],
)
def test_rank_by_key_is_fixed_across_processes(key, expected):
    # blake2b, not Python's salted hash(): these orders hold in every router replica and release.
    assert rank_by_key(key, ["w0", "w1", "w2"]) == expected
    assert rank_by_key(key, ["w2", "w1", "w0"]) == expected  # input order does not matter


KEYS = [f"conversation-{index}" for index in range(2000)]
FOUR = ["w0", "w1", "w2", "w3"]


def owners(worker_ids: list[str]) -> dict[str, str]:
    return {key: rank_by_key(key, worker_ids)[0] for key in KEYS}


def test_a_leaving_worker_moves_only_its_own_keys():
    before = owners(FOUR)
    after = owners(["w0", "w1", "w3"])
    moved = {key for key in KEYS if before[key] != after[key]}
    assert moved == {key for key in KEYS if before[key] == "w2"}
    # Its keys spread over the others instead of piling onto one.
    assert {after[key] for key in moved} == {"w0", "w1", "w3"}


def test_a_joining_worker_takes_keys_only_for_itself():
    before = owners(FOUR)
    after = owners([*FOUR, "w4"])
    moved = {key for key in KEYS if before[key] != after[key]}
    assert {after[key] for key in moved} == {"w4"}
    assert 300 < len(moved) < 500  # about a fifth of 2000 keys


def test_keys_spread_evenly():
    counts = {worker_id: 0 for worker_id in FOUR}
    for owner in owners(FOUR).values():
        counts[owner] += 1
    assert all(420 < count < 580 for count in counts.values()), counts


def test_session_key_binds_by_hash_over_workers_in_rotation(ready3):
    binding = route(ready3, headers={"x-session-id": "alice"})
    assert binding == Binding(kind=BindKind.KEY, candidates=("w2", "w0", "w1"), session="alice")


def test_session_key_skips_draining_and_unhealthy_workers(spec, table_of):
    table = table_of(spec("w0"), spec("w1"), spec("w2", WorkerState.draining))
    assert route(table, headers={"x-session-id": "alice"}).candidates == ("w0", "w1")
    table.set_health("w0", False)
    assert route(table, headers={"x-session-id": "alice"}).candidates == ("w1",)


def test_session_key_falls_through_to_the_next_worker_with_room(spec, table_of):
    table = table_of(spec("w0"), spec("w1"), spec("w2"), sessions={"w2": 2}, max_sessions=2)
    assert route(table, headers={"x-session-id": "alice"}).candidates == ("w0", "w1")


# ---- least loaded --------------------------------------------------------------------------


def test_least_loaded_orders_by_sessions_then_assigned_then_id(spec, table_of):
    table = table_of(
        spec("w0"),
        spec("w1"),
        spec("w2"),
        spec("w3"),
        sessions={"w0": 3, "w1": 1, "w2": 1, "w3": 0},
        assigned={"w0": 3, "w1": 9, "w2": 4, "w3": 7},
    )
    assert rank_by_load(table.workers()) == ["w3", "w2", "w1", "w0"]
    assert route(table) == Binding(kind=BindKind.LEAST_LOADED, candidates=("w3", "w2", "w1", "w0"))


def test_idle_workers_alternate_as_sessions_are_assigned(ready3):
    chosen = []
    for _ in range(6):
        worker_id = route(ready3).candidates[0]
        ready3.open_session(worker_id)
        ready3.close_session(worker_id)  # sequential requests: each ends before the next
        chosen.append(worker_id)
    assert chosen == ["w0", "w1", "w2", "w0", "w1", "w2"]


def test_concurrent_sessions_spread_to_the_least_loaded(ready3):
    chosen = []
    for _ in range(5):
        worker_id = route(ready3).candidates[0]
        ready3.open_session(worker_id)  # sessions stay open
        chosen.append(worker_id)
    assert chosen == ["w0", "w1", "w2", "w0", "w1"]
    ready3.close_session("w1")
    ready3.close_session("w1")
    assert route(ready3).candidates[0] == "w1"


@pytest.mark.parametrize(
    ("states", "healthy", "expected"),
    [
        ({"w0": WorkerState.ready, "w1": WorkerState.ready}, ("w0", "w1"), ("w0", "w1")),
        ({"w0": WorkerState.draining, "w1": WorkerState.ready}, ("w0", "w1"), ("w1",)),
        ({"w0": WorkerState.starting, "w1": WorkerState.ready}, ("w0", "w1"), ("w1",)),
        ({"w0": WorkerState.gone, "w1": WorkerState.ready}, ("w0", "w1"), ("w1",)),
        ({"w0": WorkerState.ready, "w1": WorkerState.ready}, ("w1",), ("w1",)),  # w0 fails /ready
    ],
)
def test_only_ready_healthy_workers_take_new_sessions(states, healthy, expected, spec, table_of):
    table = table_of(*(spec(worker_id, state) for worker_id, state in states.items()), healthy=healthy)
    assert route(table).candidates == expected


def test_admin_drain_takes_a_worker_out_of_rotation(ready3):
    ready3.drain("w0")
    assert route(ready3).candidates == ("w1", "w2")
    ready3.undrain("w0")
    assert route(ready3).candidates == ("w0", "w1", "w2")


def test_no_ready_worker_is_a_503_naming_the_known_workers(spec, table_of):
    table = table_of(spec("w0", WorkerState.starting), spec("w1", WorkerState.draining))
    with pytest.raises(RouterError) as caught:
        route(table)
    assert (caught.value.status, caught.value.code) == (503, "no_ready_worker")
    assert (
        caught.value.message
        == "No worker is ready to take a new session (known workers: w0, w1); retry shortly."
    )


def test_all_workers_full_is_a_503(spec, table_of):
    table = table_of(spec("w0"), spec("w1"), sessions={"w0": 2, "w1": 2}, max_sessions=2)
    with pytest.raises(RouterError) as caught:
        route(table)
    assert (caught.value.status, caught.value.code) == (503, "all_workers_full")


# ---- worker-naming session ids -------------------------------------------------------------


def test_session_id_in_path_pins_to_its_worker(ready3):
    session = make_session_id(worker_id="w1")
    binding = route(ready3, f"/v1/streaming_input/sessions/{session}/chunks")
    assert binding == Binding(kind=BindKind.SESSION, candidates=("w1",), session=session)


def test_session_id_in_query_or_header_pins_to_its_worker(ready3):
    session = make_session_id(worker_id="w2", prefix="rt")
    assert route(ready3, "/v1/realtime", query={"session_id": session}).candidates == ("w2",)
    assert route(ready3, "/v1/chat/completions", headers={"x-session-id": session}).candidates == ("w2",)


def test_session_ids_outrank_load_and_capacity(spec, table_of):
    table = table_of(spec("w0"), spec("w1"), sessions={"w0": 5}, max_sessions=5)
    session = make_session_id(worker_id="w0")
    assert route(table, f"/v1/streaming_input/sessions/{session}/finish").candidates == ("w0",)


@pytest.mark.parametrize("state", [WorkerState.draining, WorkerState.starting])
def test_draining_workers_keep_their_sessions(state, spec, table_of):
    table = table_of(spec("w0", state), spec("w1"))
    session = make_session_id(worker_id="w0")
    assert route(table, f"/v1/streaming_input/sessions/{session}/chunks").candidates == ("w0",)


def test_session_on_a_gone_worker_is_a_clear_503(spec, table_of):
    table = table_of(spec("w0", WorkerState.gone), spec("w1"))
    with pytest.raises(RouterError) as caught:
        route(table, "/v1/streaming_input/sessions/sess_w0.abcdefghijkl/chunks")
    assert (caught.value.status, caught.value.code) == (503, "session_worker_unavailable")
    assert caught.value.message == (
        "Session sess_w0.abcdefghijkl lives on worker w0, which is gone; start a new session."
    )


def test_session_on_an_unknown_worker_is_a_clear_503(ready3):
    with pytest.raises(RouterError) as caught:
        route(ready3, "/v1/streaming_input/sessions/sess_w9.abcdefghijkl/chunks")
    assert (caught.value.code, caught.value.worker) == ("session_worker_unavailable", "w9")


def test_path_segments_that_are_not_session_ids_do_not_pin(ready3):
    assert route(ready3, "/v1/files/file-abc123/content").kind is BindKind.LEAST_LOADED
    assert route(ready3, "/v1/models/tiny.omni").kind is BindKind.LEAST_LOADED


def test_two_router_instances_agree_without_shared_state(spec, table_of):
    # Same worker table, different histories of load: session ids and keys still agree.
    specs = [spec("w0"), spec("w1"), spec("w2"), spec("w3")]
    first = table_of(*specs, sessions={"w0": 4, "w1": 0, "w2": 1, "w3": 2})
    second = table_of(*specs, sessions={"w0": 0, "w1": 3, "w2": 0, "w3": 0})
    for worker_id in ("w0", "w1", "w2", "w3"):
        session = make_session_id(worker_id=worker_id)
        path = f"/v1/streaming_input/sessions/{session}/chunks"
        assert route(first, path).candidates == route(second, path).candidates == (worker_id,)
    for key in KEYS[:200]:
        headers = {"x-session-id": key}
        assert route(first, headers=headers).candidates[0] == route(second, headers=headers).candidates[0]
    # Least-loaded choices are each router's own, so they may differ.
    assert route(first).candidates[0] == "w1"
    assert route(second).candidates[0] == "w0"


def test_a_custom_session_header_is_read_case_insensitively(ready3):
    binding = bind(
        ready3, path="/x", query={}, headers={"x-conversation": "alice"}, session_header="X-Conversation"
    )
    assert binding.candidates == ("w2", "w0", "w1")


# ---- retry ---------------------------------------------------------------------------------


def test_retry_goes_to_the_next_candidate_still_in_rotation(ready3):
    binding = Binding(kind=BindKind.LEAST_LOADED, candidates=("w0", "w1", "w2"))
    assert retry_candidate(binding, failed=["w0"], table=ready3) == "w1"
    ready3.set_health("w1", False)
    assert retry_candidate(binding, failed=["w0"], table=ready3) == "w2"


def test_a_pinned_session_is_never_retried_elsewhere(ready3):
    binding = Binding(kind=BindKind.SESSION, candidates=("w0",), session="sess_w0.abcdefghijkl")
    assert retry_candidate(binding, failed=["w0"], table=ready3) is None
