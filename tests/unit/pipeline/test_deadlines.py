"""Deadline order of vocoder windows: the playback clock, the priority key, the batch choice, and
the batching worker that applies them (real threads, the order observed in the calls it makes)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from omni_runtime.contract.adapter import window_shape
from omni_runtime.pipeline.deadlines import (
    FarWindows,
    PlaybackClock,
    ahead_slack,
    far_windows,
    holds_thinker,
    lingers,
    near_streams,
    priority,
    take,
)
from omni_runtime.pipeline.workers import BatchingWorker, StageThread


@pytest.mark.parametrize(
    ("sends", "now", "slack"),
    [
        ([], 5.0, None),  # no audio yet: a first window
        ([(1.0, 2.0)], 1.5, 1.5),  # 2 s sent at 1.0: runs dry at 3.0
        ([(1.0, 2.0), (2.0, 1.0)], 2.5, 1.5),  # queued behind the first: dry at 4.0
        ([(1.0, 1.0), (3.0, 1.0)], 3.5, 0.5),  # came late (stall 2.0 to 3.0): dry at 4.0
        ([(1.0, 1.0)], 2.5, -0.5),  # already stalled half a second
    ],
)
def test_playback_clock(sends: list[tuple[float, float]], now: float, slack: float | None) -> None:
    clock = PlaybackClock()
    for at, seconds in sends:
        clock.sent(now=at, seconds=seconds)
    assert clock.slack(now=now) == slack


@pytest.mark.parametrize(
    ("slack", "queued", "ahead"),
    [
        (None, 0.0, None),  # nothing at the vocoder, no audio yet: a first window
        (1.5, 0.0, 1.5),  # nothing queued: the stream's own slack
        (None, 0.2, 0.2),  # cut while the first window (0.2 s) is synthesised: dry 0.2 s after it
        (0.5, 0.8, 1.3),  # 0.5 s buffered, 0.8 s more on its way
        (-0.4, 0.8, 0.8),  # stalled: the play head waits, then plays the queued 0.8 s
        (0.0, 0.4, 0.4),
    ],
)
def test_ahead_slack(slack: float | None, queued: float, ahead: float | None) -> None:
    assert ahead_slack(slack, queued) == ahead


@pytest.mark.parametrize(
    ("slack", "below", "holds"),
    [
        (None, None, False),  # the vocoder has a GPU of its own: never
        (0.0, None, False),
        (None, float("-inf"), True),  # first windows only: a first window holds
        (-0.3, float("-inf"), False),  # ... a stalled later one does not
        (None, 0.25, True),
        (0.1, 0.25, True),  # a listener 0.1 s from running dry
        (-0.2, 0.25, True),  # already stalled
        (0.25, 0.25, False),  # exactly at the threshold: not below it
        (2.0, 0.25, False),  # seconds buffered
    ],
)
def test_holds_thinker(slack: float | None, below: float | None, holds: bool) -> None:
    assert holds_thinker(slack_s=slack, below_s=below) is holds


@pytest.mark.parametrize(
    ("slack", "below", "holds"),
    [
        (None, 0.25, True),  # a first window still holds: it is a first audio itself
        (0.1, 0.25, False),  # a later one gives way to a reply that hears nothing yet
        (-0.2, 0.25, False),  # even a stalled one: first audio goes first, as in the vocoder's line
        (None, None, False),  # a vocoder on its own GPU never holds
    ],
)
def test_no_later_window_holds_the_thinker_while_another_reply_waits_for_first_audio(
    slack: float | None, below: float | None, holds: bool
) -> None:
    assert holds_thinker(slack_s=slack, below_s=below, first_audio_pending=True) is holds


@pytest.mark.parametrize(
    ("slack", "below", "holds"),
    [
        (None, 0.25, True),  # a first window holds: it is a first audio
        (0.1, 0.25, False),  # a later one leaves the other reply's text (its next codes) running
        (-0.2, 0.25, False),  # even a stalled one
        (None, None, False),  # a vocoder on its own GPU never holds
    ],
)
def test_no_later_window_holds_the_thinker_while_another_reply_s_talker_takes_its_text(
    slack: float | None, below: float | None, holds: bool
) -> None:
    assert holds_thinker(slack_s=slack, below_s=below, text_pending=True) is holds


def test_priority_puts_first_windows_first_then_earliest_deadline() -> None:
    now = 100.0
    keys = {
        "first-late": priority(slack_s=None, now=now, seq=7),
        "first-early": priority(slack_s=None, now=now, seq=3),
        "buffered": priority(slack_s=4.0, now=now, seq=0),
        "dry-soon": priority(slack_s=0.2, now=now, seq=5),
        "stalled": priority(slack_s=-0.5, now=now, seq=6),
        "tie-later": priority(slack_s=0.2, now=now, seq=9),
    }
    assert sorted(keys, key=keys.__getitem__) == [
        "first-early",
        "first-late",
        "stalled",
        "dry-soon",
        "tie-later",
        "buffered",
    ]
    # the same slack submitted later has a later deadline
    assert priority(slack_s=1.0, now=1.0, seq=0) < priority(slack_s=1.0, now=2.0, seq=0)


@pytest.mark.parametrize(
    ("waiting", "max_batch", "batch", "left"),
    [
        ([], 4, [], []),
        ([((1, 3.0, 0), "a"), ((0, 0.0, 1), "b")], 4, ["b", "a"], []),
        (
            [
                ((1, 3.0, 0), "a"),
                ((1, 1.0, 1), "b"),
                ((0, 0.0, 2), "c"),
                ((1, 2.0, 3), "d"),
                ((1, 9.0, 4), "e"),
            ],
            2,
            ["c", "b"],
            ["d", "a", "e"],
        ),
    ],
)
def test_take(
    waiting: list[tuple[tuple[int, float, int], str]], max_batch: int, batch: list[str], left: list[str]
) -> None:
    chosen, rest = take(waiting, max_batch)
    assert chosen == batch
    assert [item for _, item in rest] == left


# (priority, "name:shape"): the group is the part after the colon.
FIRST_A = ((0, 0.0, 0), "first1:15")
FIRST_B = ((0, 0.0, 3), "first2:15")
STALLED = ((1, 0.5, 1), "stalled:55")
DRY = ((1, 0.8, 2), "dry:55")
TAIL = ((1, 0.6, 4), "tail:31")


@pytest.mark.parametrize(
    ("waiting", "max_batch", "batch", "left"),
    [
        ([], 4, [], []),
        # the most urgent window's shape only: the other shapes keep their order for the next call
        (
            [STALLED, FIRST_A, DRY, TAIL, FIRST_B],
            8,
            ["first1:15", "first2:15"],
            ["stalled:55", "tail:31", "dry:55"],
        ),
        ([STALLED, DRY, TAIL], 8, ["stalled:55", "dry:55"], ["tail:31"]),
        # a less urgent window of the same shape rides along; max_batch still bounds the call
        ([STALLED, DRY, TAIL], 1, ["stalled:55"], ["tail:31", "dry:55"]),
        ([TAIL, DRY], 8, ["tail:31"], ["dry:55"]),
    ],
)
def test_take_one_group(
    waiting: list[tuple[tuple[int, float, int], str]], max_batch: int, batch: list[str], left: list[str]
) -> None:
    chosen, rest = take(waiting, max_batch, group=lambda name: name.split(":")[1])
    assert chosen == batch
    assert [item for _, item in rest] == left
    assert take(waiting, max_batch, group=None)[0] == [item for _, item in sorted(waiting)][:max_batch]


# Deadlines are absolute (monotonic seconds); ``now`` is 10.0, far means more than 1.0 s of audio left.
NEAR = ((1, 10.5, 1), "near:55")  # 0.5 s left
NEAR_31 = ((1, 10.2, 5), "near31:31")
FAR_1 = ((1, 12.0, 2), "far1:55")  # 2 s left
FAR_2 = ((1, 13.0, 3), "far2:55")
FAR_3 = ((1, 14.0, 4), "far3:55")
FIRST = ((0, 0.0, 6), "first:15")  # a first window is never far


@pytest.mark.parametrize(
    ("waiting", "batch", "left"),
    [
        ([], [], []),
        # a near window's call leaves the far ones of its shape for later
        ([FAR_1, NEAR, FAR_2], ["near:55"], ["far1:55", "far2:55"]),
        # ... and a first window's call too (theirs is another shape anyway)
        ([FAR_1, FIRST], ["first:15"], ["far1:55"]),
        # far windows alone: a call of at most two
        ([FAR_3, FAR_1, FAR_2], ["far1:55", "far2:55"], ["far3:55"]),
        # the most urgent decides the shape; a near window of another shape keeps its place
        ([FAR_1, NEAR_31, NEAR], ["near31:31"], ["near:55", "far1:55"]),
        # exactly at the threshold is not far
        ([((1, 11.0, 7), "edge:55"), NEAR], ["near:55", "edge:55"], []),
    ],
)
def test_take_keeps_far_windows_out_of_near_calls(
    waiting: list[tuple[tuple[int, float, int], str]], batch: list[str], left: list[str]
) -> None:
    far = FarWindows(after_s=1.0, batch=2)
    chosen, rest = take(waiting, 8, group=lambda name: name.split(":")[1], far=far, now=10.0)
    assert chosen == batch
    assert [item for _, item in rest] == left
    # without the rule, the same line as before: far windows ride along up to max_batch
    assert take(waiting, 8, group=None, far=None)[0] == [item for _, item in sorted(waiting)][:8]


@pytest.mark.parametrize(
    ("near", "near_only", "batch"),
    [
        (True, False, ["far1:55", "far2:55"]),  # the bound always holds
        (False, False, ["far1:55", "far2:55"]),
        (True, True, ["far1:55", "far2:55"]),  # near_only, a stream is near: bounded
        (False, True, ["far1:55", "far2:55", "far3:55"]),  # every stream far: a full call
    ],
)
def test_far_calls_are_bounded_only_while_a_stream_is_near_with_near_only(
    near: bool, near_only: bool, batch: list[str]
) -> None:
    far = FarWindows(after_s=1.0, batch=2, near_only=near_only)
    waiting = [FAR_3, FAR_1, FAR_2]
    chosen, rest = take(waiting, 8, group=lambda name: name.split(":")[1], far=far, now=10.0, near=near)
    assert chosen == batch
    assert len(chosen) + len(rest) == 3
    # a near window's call keeps the far ones out either way
    assert take([FAR_1, NEAR], 8, far=far, now=10.0, near=near)[0] == ["near:55"]


@pytest.mark.parametrize(
    ("slacks", "within", "near"),
    [
        ([], 1.0, False),
        ([2.0, 1.5], 1.0, False),
        ([2.0, 0.9], 1.0, True),
        ([2.0, None], 1.0, True),  # before its first audio
        ([1.0], 1.0, False),  # exactly at the threshold is not near
        ([-0.2], 0.0, True),  # stalled
    ],
)
def test_near_streams(slacks: list[float | None], within: float, near: bool) -> None:
    assert near_streams(slacks, within_s=within) is near


@pytest.mark.parametrize(
    ("setting", "far"),
    [
        (None, None),
        ("", None),
        ("off", None),
        (" off ", None),
        ("1.0,4", FarWindows(after_s=1.0, batch=4)),
        ("0,1", FarWindows(after_s=0.0, batch=1)),
        ("0.6, 2 ,near", FarWindows(after_s=0.6, batch=2, near_only=True)),
    ],
)
def test_far_windows_setting(setting: str | None, far: FarWindows | None) -> None:
    assert far_windows(setting) == far


@pytest.mark.parametrize(
    "setting",
    ["1.0", "a,4", "1.0,0", "-1,4", "1.0,4,2", "1.0,2.5", "1.0,4,far", "1.0,4,near,near", "OFF", "no"],
)
def test_far_windows_setting_names_its_format_when_wrong(setting: str) -> None:
    with pytest.raises(
        ValueError,
        match=r"^OMNI_VOCODER_FAR is '.*', not SECONDS,WINDOWS\[,near\] or off .*; use e.g. 1.0,4,near$",
    ):
        far_windows(setting)


def test_window_shape_is_context_size_and_reuse() -> None:
    window = {"start": 10, "end": 50, "ctx_start": 0, "ctx_end": 55}
    assert window_shape({"window": window, "reusable": True}) == (55, True)
    assert window_shape({"window": {**window, "ctx_end": 31}}) == (31, False)


def _recording(
    calls: list[list[str]], release: threading.Event
) -> Callable[[list[dict[str, object]]], list[str]]:
    """A vocoder for the worker tests: records each call's window names, and the call of the window
    named "busy" blocks until ``release`` is set, so the others queue behind it."""

    def synthesize(items: list[dict[str, object]]) -> list[str]:
        calls.append([str(item["name"]) for item in items])
        if calls[-1] == ["busy"]:
            release.wait(timeout=30)
        return calls[-1]

    return synthesize


async def _behind_busy(
    worker: BatchingWorker[dict[str, object], str],
    thread: StageThread,
    release: threading.Event,
    busy: dict[str, object],
    queued: list[dict[str, object]],
) -> None:
    """Start ``worker``, let its call of ``busy`` block (``_recording``) until every ``queued``
    window waits in its line, then release it and wait for them all; stop the worker after."""
    worker.start()
    try:
        first = asyncio.ensure_future(worker.submit(busy))
        while not worker.batches:
            await asyncio.sleep(0.01)
        futures = [asyncio.ensure_future(worker.submit(q)) for q in queued]
        while worker.queue_depth < len(queued):
            await asyncio.sleep(0.01)
        release.set()
        await asyncio.gather(first, *futures)
    finally:
        await worker.stop()
        thread.shutdown()


async def test_worker_calls_one_window_shape_at_a_time() -> None:
    """The vocoder's worker: a call holds windows of one shape, the most urgent one's."""
    release = threading.Event()
    calls: list[list[str]] = []

    synthesize = _recording(calls, release)

    def order(item: dict[str, object], seq: int) -> tuple[int, float, int]:
        slack = item["slack_s"]
        return priority(slack_s=None if slack is None else float(slack), now=0.0, seq=seq)  # type: ignore[arg-type]

    def item(name: str, slack: float | None, size: int) -> dict[str, object]:
        window = {"start": 0, "end": size, "ctx_start": 0, "ctx_end": size}
        return {"name": name, "slack_s": slack, "window": window, "reusable": size in (15, 55)}

    thread = StageThread("vocoder-shape-test")
    worker: BatchingWorker[dict[str, object], str] = BatchingWorker(
        "talker_stream", synthesize, thread=thread, max_batch=16, order=order, group=window_shape
    )
    queued = [("steady", 0.4, 55), ("short-reply", 0.1, 31), ("first", None, 15), ("steady2", 0.9, 55)]
    await _behind_busy(worker, thread, release, item("busy", None, 15), [item(*q) for q in queued])
    assert calls == [["busy"], ["first"], ["short-reply"], ["steady", "steady2"]]
    waits = {w.kind: w for w in worker.waits.snapshot()}  # omni_stage_wait_seconds{kind}
    assert (waits["first"].count, waits["later"].count) == (2, 3)
    assert waits["later"].sum_s >= 3 * waits["first"].sum_s / 2 > 0  # the later ones queued longer


async def test_worker_with_far_windows_keeps_calls_short() -> None:
    """The vocoder's worker with ``far`` set (``OMNI_VOCODER_FAR``), on the engine's own order: a
    near window's call carries no far window, and far windows go in calls of at most two."""
    from omni_runtime.pipeline.services import window_priority

    release = threading.Event()
    calls: list[list[str]] = []

    synthesize = _recording(calls, release)

    def item(name: str, slack: float | None) -> dict[str, object]:
        window = {"start": 0, "end": 55, "ctx_start": 0, "ctx_end": 55}
        return {"name": name, "slack_s": slack, "window": window, "reusable": True}

    thread = StageThread("vocoder-far-test")
    worker: BatchingWorker[dict[str, object], str] = BatchingWorker(
        "talker_stream", synthesize, thread=thread, max_batch=16, order=window_priority, group=window_shape
    )
    worker.far = FarWindows(after_s=1.0, batch=2)
    queued = [("far1", 30.0), ("near", 0.3), ("far2", 31.0), ("far3", 32.0)]
    await _behind_busy(worker, thread, release, item("busy", None), [item(*q) for q in queued])
    assert calls == [["busy"], ["near"], ["far1", "far2"], ["far3"]]


@pytest.mark.parametrize(
    ("streams_near", "after_near"),
    [
        (True, [["far1", "far2"], ["far3"]]),
        (False, [["far1", "far2", "far3"]]),
        (None, [["far1", "far2", "far3"]]),  # no play heads (behind a stage link): never bounded
    ],
)
async def test_worker_bounds_far_calls_only_while_its_near_callable_says_so(
    streams_near: bool | None, after_near: list[list[str]]
) -> None:
    """With ``near_only`` the worker asks ``near(after_s)`` (the engine's play heads) before each
    call of far windows: bounded while a stream is near, full when none is."""
    from omni_runtime.pipeline.services import window_priority

    release = threading.Event()
    calls: list[list[str]] = []
    asked: list[float] = []

    def item(name: str, slack: float | None) -> dict[str, object]:
        window = {"start": 0, "end": 55, "ctx_start": 0, "ctx_end": 55}
        return {"name": name, "slack_s": slack, "window": window, "reusable": True}

    def near(within_s: float) -> bool:
        asked.append(within_s)
        return bool(streams_near)

    thread = StageThread("vocoder-near-test")
    worker: BatchingWorker[dict[str, object], str] = BatchingWorker(
        "talker_stream",
        _recording(calls, release),
        thread=thread,
        max_batch=16,
        order=window_priority,
        group=window_shape,
    )
    worker.far = FarWindows(after_s=1.5, batch=2, near_only=True)
    worker.near = near if streams_near is not None else None
    queued = [("far1", 30.0), ("near", 0.3), ("far2", 31.0), ("far3", 32.0)]
    await _behind_busy(worker, thread, release, item("busy", None), [item(*q) for q in queued])
    assert calls == [["busy"], ["near"], *after_near]
    assert set(asked) == (set() if streams_near is None else {1.5})


async def test_worker_runs_the_most_urgent_windows_first() -> None:
    release = threading.Event()
    calls: list[list[str]] = []

    def synthesize(items: list[dict[str, object]]) -> list[str]:
        names = [str(item["name"]) for item in items]
        calls.append(names)
        if names == ["busy"]:
            release.wait(timeout=30)  # holds the vocoder while the others queue up
        return names

    def order(item: dict[str, object], seq: int) -> tuple[int, float, int]:
        slack = item["slack_s"]
        return priority(slack_s=None if slack is None else float(slack), now=0.0, seq=seq)  # type: ignore[arg-type]

    thread = StageThread("vocoder-test")
    worker: BatchingWorker[dict[str, object], str] = BatchingWorker(
        "talker_stream", synthesize, thread=thread, max_batch=2, order=order
    )
    worker.start()
    try:
        busy = asyncio.ensure_future(worker.submit({"name": "busy", "slack_s": None}))
        while not calls:  # the vocoder has taken the first window
            await asyncio.sleep(0.01)
        queued = [
            ("buffered", 5.0),
            ("second-first", None),
            ("stalled", -1.0),
            ("dry-soon", 0.5),
        ]
        futures = [asyncio.ensure_future(worker.submit({"name": n, "slack_s": s})) for n, s in queued]
        while worker.queue_depth < len(queued):
            await asyncio.sleep(0.01)
        release.set()
        results = await asyncio.gather(busy, *futures)
    finally:
        await worker.stop()
        thread.shutdown()
    assert results == ["busy", "buffered", "second-first", "stalled", "dry-soon"]  # each its own answer
    assert calls == [["busy"], ["second-first", "stalled"], ["dry-soon", "buffered"]]


async def test_worker_without_order_keeps_arrival_order() -> None:
    calls: list[list[int]] = []

    def fn(items: list[int]) -> list[int]:
        calls.append(items)
        return [i * 10 for i in items]

    thread = StageThread("fifo-test")
    worker: BatchingWorker[int, int] = BatchingWorker("fifo", fn, thread=thread, max_batch=2)
    worker.start()
    try:
        assert await asyncio.gather(*(worker.submit(i) for i in (3, 1, 2))) == [30, 10, 20]
    finally:
        await worker.stop()
        thread.shutdown()
    assert [i for batch in calls for i in batch] == [3, 1, 2]


async def test_a_broken_group_fails_the_waiting_requests_instead_of_hanging_them() -> None:
    release = threading.Event()

    def fn(items: list[dict[str, object]]) -> list[str]:
        release.wait(timeout=30)
        return ["ok"] * len(items)

    def order(item: dict[str, object], seq: int) -> tuple[int, float, int]:
        return priority(slack_s=None, now=0.0, seq=seq)

    thread = StageThread("broken-group-test")
    worker: BatchingWorker[dict[str, object], str] = BatchingWorker(
        "talker_stream", fn, thread=thread, max_batch=4, order=order, group=window_shape
    )
    worker.start()
    try:
        window = {"start": 0, "end": 15, "ctx_start": 0, "ctx_end": 15}
        first = asyncio.ensure_future(worker.submit({"name": "fine", "window": window}))
        while not worker.batches:  # the first call took it and waits for the release
            await asyncio.sleep(0.01)
        late = [asyncio.ensure_future(worker.submit({"name": f"no window {i}"})) for i in range(2)]
        while worker.queue_depth < 2:
            await asyncio.sleep(0.01)
        release.set()
        assert await first == "ok"
        outcomes = await asyncio.wait_for(asyncio.gather(*late, return_exceptions=True), timeout=10)
    finally:
        await worker.stop()
        thread.shutdown()
    assert all(isinstance(outcome, KeyError) for outcome in outcomes)


@pytest.mark.parametrize(
    ("others", "within", "waits"),
    [
        ([], 3, False),  # alone: never waits
        ([2], 3, True),  # another reply two codes from its first window
        ([3], 3, True),
        ([4], 3, False),  # too far: it would wait more than a step or two
        ([0], 3, False),  # cut now, on its way to the vocoder: nothing to wait for
        ([None], 3, False),  # cut already (or not streaming)
        ([None, 25, 1], 3, True),  # one near one is enough
        ([None, 25, 0], 3, False),
        ([1], 0, False),  # within 0: never waits
    ],
)
def test_a_ready_first_window_lingers_only_for_first_windows_a_few_codes_away(
    others: list[int | None], within: int, waits: bool
) -> None:
    assert lingers(others, within=within) is waits
    # with another first window already waiting, this one is its company: it never waits too
    assert lingers(others, within=within, waiting=True) is False
