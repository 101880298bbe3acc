"""Cutting the codec stream into vocoder windows: exact windows for streaming and whole mode."""

from __future__ import annotations

from dataclasses import replace

import pytest

from omni_runtime.pipeline.segmenter import CodecSegmenter, SegmenterConfig, Window, widen_to_recurring

CFG = SegmenterConfig(first_chunk=4, chunk=6, left_context=2, right_context=1)


def test_windows_wait_for_right_context_then_tile_the_stream() -> None:
    seg = CodecSegmenter(CFG)
    assert seg.push(4) == []  # 4 codes, but the first window also needs 1 code of right context
    assert seg.push(5) == [Window(0, 4, 0, 5)]
    assert seg.push(10) == []
    assert seg.push(11) == [Window(4, 10, 2, 11)]
    assert seg.push(23) == [Window(10, 16, 8, 17), Window(16, 22, 14, 23)]


def test_the_end_of_the_stream_flushes_a_short_tail() -> None:
    seg = CodecSegmenter(CFG)
    assert seg.push(7) == [Window(0, 4, 0, 5)]
    assert seg.push(7, done=True) == [Window(4, 7, 2, 7)]
    assert seg.push(7, done=True) == []
    assert seg.emitted_until == 7


def test_a_stream_that_ends_early_is_one_window() -> None:
    seg = CodecSegmenter(CFG)
    assert seg.push(3, done=True) == [Window(0, 3, 0, 3)]


def test_whole_mode_synthesises_once_at_the_end() -> None:
    seg = CodecSegmenter(SegmenterConfig(whole=True))
    assert seg.push(100) == []
    assert seg.push(120, done=True) == [Window(0, 120, 0, 120)]


@pytest.mark.parametrize("codes", [1, 4, 5, 6, 11, 17, 23, 40, 101])
def test_at_end_mode_tiles_the_finished_stream_like_streaming(codes: int) -> None:
    seg = CodecSegmenter(
        SegmenterConfig(first_chunk=4, chunk=6, left_context=2, right_context=1, at_end=True)
    )
    assert seg.push(codes) == []  # nothing before the stream ends
    windows = seg.push(codes, done=True)
    assert windows == CodecSegmenter(CFG).push(codes, done=True)  # the streaming windows, at once
    # they tile the stream exactly: contiguous kept spans from 0 to the last code
    assert [w.start for w in windows] == [0, *(w.end for w in windows[:-1])]
    assert windows[-1].end == codes
    assert all(w.ctx_start <= w.start < w.end <= w.ctx_end <= codes for w in windows)
    assert seg.push(codes, done=True) == []


@pytest.mark.parametrize(
    ("codes", "expected"),
    [
        (3, [Window(0, 3, 0, 3)]),
        (12, [Window(0, 4, 0, 5), Window(4, 10, 2, 11), Window(10, 12, 8, 12)]),
    ],
)
def test_at_end_windows_of_short_streams(codes: int, expected: list[Window]) -> None:
    seg = CodecSegmenter(
        SegmenterConfig(first_chunk=4, chunk=6, left_context=2, right_context=1, at_end=True)
    )
    assert seg.push(codes, done=True) == expected


def test_recurring_window_sizes_of_the_default_stream() -> None:
    seg = CodecSegmenter()
    # first: 5 codes + 5 right; second: starts at 5, so only 5 codes of left context; then steady.
    assert seg.recurring_sizes() == frozenset({10, 50, 55})
    assert seg.codes_to_cover() == 90
    windows = CodecSegmenter().push(seg.codes_to_cover())
    assert {w.ctx_end - w.ctx_start for w in windows} == seg.recurring_sizes()


def test_recurring_sizes_follow_the_config() -> None:
    # first 4 + 1 right = 5; the second already has its full 2 codes of left context: 2 + 6 + 1.
    assert CodecSegmenter(CFG).recurring_sizes() == frozenset({5, 9})


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        # a stream's last window, 12 codes of context: widened left to the recurring 50
        (Window(95, 100, 85, 100), Window(95, 100, 50, 100)),
        # one code short of the steady size: one more code of left context
        (Window(60, 100, 46, 100), Window(60, 100, 45, 100)),
        # already recurring: unchanged
        (Window(10, 50, 0, 55), Window(10, 50, 0, 55)),
        # too short a stream for any larger recurring size that fits: 8 codes exist, 10 needs 10
        (Window(0, 8, 0, 8), Window(0, 8, 0, 8)),
        # 30 codes exist: 50 and 55 do not fit, so the window stays eager
        (Window(5, 30, 0, 30), Window(5, 30, 0, 30)),
        # 18 codes of context, 60 exist: the smallest size that fits (50), not 55
        (Window(52, 60, 42, 60), Window(52, 60, 10, 60)),
    ],
)
def test_last_windows_widen_to_a_recurring_size(window: Window, expected: Window) -> None:
    assert widen_to_recurring(window, frozenset({10, 50, 55})) == expected


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        # a lone stream's last window (10 codes, 20 of context): the busy size 27, not 25
        (Window(390, 400, 380, 400), Window(390, 400, 373, 400)),
        # 26 codes exist: 27 does not fit, so the smallest that does (25)
        (Window(16, 26, 6, 26), Window(16, 26, 1, 26)),
        # larger than the busy size already: the smallest larger size (35), as without a preference
        (Window(372, 400, 362, 400), Window(372, 400, 355, 400)),
        # a recurring size (a lone stream's second window) stays
        (Window(10, 20, 0, 25), Window(10, 20, 0, 25)),
    ],
)
def test_last_windows_prefer_the_busy_streams_size(window: Window, expected: Window) -> None:
    sizes = CodecSegmenter(replace(BUSY, first_chunk_busy=22, ramp_busy=(10, 10, 20, 30))).recurring_sizes()
    assert sizes == frozenset({15, 25, 27, 35, 45, 55})
    assert widen_to_recurring(window, sizes, prefer=27) == expected
    assert CodecSegmenter(replace(BUSY, first_chunk_busy=22)).busy_size == 27
    assert CodecSegmenter(replace(BUSY, first_chunk_busy=0)).busy_size is None


RAMP = SegmenterConfig(first_chunk=4, ramp=(6, 9), chunk=15, left_context=25, right_context=1)


def test_a_ramp_grows_the_windows_before_the_steady_ones() -> None:
    seg = CodecSegmenter(RAMP)
    assert seg.push(5) == [Window(0, 4, 0, 5)]
    assert seg.push(10) == []  # the second window is 6 codes (not 15): it needs 4 + 6 + 1
    assert seg.push(11) == [Window(4, 10, 0, 11)]
    assert seg.push(20) == [Window(10, 19, 0, 20)]  # then 9
    assert seg.push(50) == [Window(19, 34, 0, 35), Window(34, 49, 9, 50)]  # then steady 15s
    assert seg.push(52, done=True) == [Window(49, 52, 24, 52)]


def test_recurring_sizes_cover_the_ramp() -> None:
    seg = CodecSegmenter(RAMP)
    # first 5; ramp 11, 20; then 35 (left context cut at 0), 41 (full 25 + 15 + 1)
    assert seg.codes_to_cover() == 4 + 6 + 9 + 2 * 15 + 1
    assert seg.recurring_sizes() == frozenset({5, 11, 20, 35, 41})


# Catch-up: the talker ran ahead while earlier windows waited for the vocoder.
@pytest.mark.parametrize(
    ("pushes", "expected"),
    [
        # 30 codes exist when the second window is cut: one window to the largest recurring
        # context (20 codes: ends at 19) instead of the planned 6 and then 9
        ([(5, False), (30, False)], [[Window(0, 4, 0, 5)], [Window(4, 19, 0, 20)]]),
        # the ramp moved on past what the catch-up covered: next is a steady 15, capped there
        (
            [(5, False), (30, False), (60, False)],
            [[Window(0, 4, 0, 5)], [Window(4, 19, 0, 20)], [Window(19, 34, 0, 35), Window(34, 49, 9, 50)]],
        ),
        # no recurring size between the planned end and what exists: the planned window
        ([(5, False), (15, False)], [[Window(0, 4, 0, 5)], [Window(4, 10, 0, 11)]]),
        # done: the rest in one window when it fits under the steady size
        ([(5, False), (14, True)], [[Window(0, 4, 0, 5)], [Window(4, 14, 0, 14)]]),
        # done with more than a steady window left: catch-up windows, then the tail
        (
            [(5, False), (45, True)],
            [[Window(0, 4, 0, 5)], [Window(4, 19, 0, 20), Window(19, 34, 0, 35), Window(34, 45, 9, 45)]],
        ),
    ],
)
def test_catch_up_windows_cover_what_the_talker_already_made(
    pushes: list[tuple[int, bool]], expected: list[list[Window]]
) -> None:
    seg = CodecSegmenter(RAMP)
    assert [seg.push(available, done=done) for available, done in pushes] == expected


def test_without_catch_up_the_planned_windows_queue_up() -> None:
    seg = CodecSegmenter(SegmenterConfig(**{**RAMP.__dict__, "catch_up": False}))
    assert seg.push(5) == [Window(0, 4, 0, 5)]
    assert seg.push(30) == [Window(4, 10, 0, 11), Window(10, 19, 0, 20)]


def test_limit_cuts_one_window_and_leaves_the_rest_for_later_codes() -> None:
    seg = CodecSegmenter(RAMP)
    assert seg.push(60, limit=1) == [Window(0, 4, 0, 5)]  # the first window never catches up
    assert seg.push(60, limit=1) == [Window(4, 19, 0, 20)]
    assert seg.push(80, limit=1) == [Window(19, 34, 0, 35)]


@pytest.mark.parametrize("available", [11, 17, 23, 31, 47, 64, 90, 200])
def test_catch_up_windows_tile_the_stream_at_recurring_sizes(available: int) -> None:
    """Any push pattern: contiguous kept spans, and every window that has its full right context
    has a recurring context size (a captured graph)."""
    for cfg in (RAMP, SegmenterConfig(ramp=(10, 20, 30))):
        seg = CodecSegmenter(cfg)
        sizes = seg.recurring_sizes()
        windows = seg.push(cfg.first_chunk + cfg.right_context) + seg.push(available)
        windows += seg.push(available + 7, done=True)
        assert [w.start for w in windows] == [0, *(w.end for w in windows[:-1])]
        assert windows[-1].end == available + 7
        for w in windows:
            if w.ctx_end == w.end + cfg.right_context:
                assert w.ctx_end - w.ctx_start in sizes, (cfg, available, w)
            assert w.end - w.start <= max(cfg.chunk, *cfg.ramp, cfg.first_chunk)


def test_a_ramp_from_json_becomes_the_configs_tuple() -> None:
    """A bench variant's windows come from JSON, where a ramp is a list."""
    from omni_runtime.pipeline.segmenter import family_config

    config = family_config({"first_chunk": 10, "ramp": [10, 10, 20, 30]})
    assert config.ramp == (10, 10, 20, 30) and hash(config) == hash(replace(config))
    assert (
        CodecSegmenter(config).recurring_sizes()
        == CodecSegmenter(family_config({"first_chunk": 10, "ramp": (10, 10, 20, 30)})).recurring_sizes()
    )


# Under load, a longer first window (the Qwen2.5 family's sizes, in codes).
BUSY = SegmenterConfig(
    first_chunk=10,
    ramp=(10, 20, 30),
    chunk=40,
    left_context=10,
    right_context=5,
    first_chunk_busy=20,
    busy_streams=12,
)


@pytest.mark.parametrize(
    ("streams", "first"),
    [
        (1, Window(0, 10, 0, 15)),
        (11, Window(0, 10, 0, 15)),
        (12, Window(0, 20, 0, 25)),
        (32, Window(0, 20, 0, 25)),
    ],
)
def test_the_first_window_grows_once_the_worker_carries_busy_streams(streams: int, first: Window) -> None:
    seg = CodecSegmenter(BUSY)
    assert seg.push(first.ctx_end - 1, streams=streams) == []  # its right context is not there yet
    assert not seg.first_busy
    assert seg.push(first.ctx_end, streams=streams) == [first]
    assert seg.first_busy == (streams >= 12)


def test_the_load_when_the_first_window_is_cut_decides_it_and_the_ramp_follows_it() -> None:
    seg = CodecSegmenter(BUSY)
    assert seg.push(14, streams=1) == []  # a lone stream so far: 10 codes, not yet 15 exist
    assert seg.push(15, streams=16) == []  # a wave arrived before the cut: now 20 codes
    assert seg.push(25, streams=16) == [Window(0, 20, 0, 25)]
    # then the ramp as planned after a first window: 10, 20, 30, steady 40 (load no longer matters)
    assert seg.push(35, streams=1) == [Window(20, 30, 10, 35)]
    assert seg.push(55) == [Window(30, 50, 20, 55)]
    assert seg.push(85) == [Window(50, 80, 40, 85)]
    assert seg.push(125) == [Window(80, 120, 70, 125)]


@pytest.mark.parametrize(
    ("available", "first"),
    [
        (25, Window(0, 20, 0, 25)),  # the busy window's codes exist: it is cut at the busy size
        (26, Window(0, 20, 0, 25)),
        (24, Window(0, 10, 0, 15)),  # not yet: the lone stream's first window, as planned
        (15, Window(0, 10, 0, 15)),
    ],
)
def test_a_stream_whose_load_fell_before_its_first_window_keeps_the_codes_it_has(
    available: int, first: Window
) -> None:
    """A stream of a busy worker waits for 20 codes; the others end before it has them, and it is
    a lone stream again. Its first window takes the busy size if those codes exist (no later
    for it, 0.4 s of audio instead of 0.2 while the vocoder still serves the others' last
    windows), otherwise the lone stream's 10; the ramp follows what was cut."""
    seg = CodecSegmenter(BUSY)
    assert seg.push(20, streams=16) == []
    assert seg.push(available, streams=1) == [first]
    assert seg.first_busy == (first.end == 20)
    planned = CodecSegmenter(replace(BUSY, catch_up=False))  # without catch-up: the planned size
    assert planned.push(available, streams=1, limit=1) == [Window(0, 10, 0, 15)]
    at_end = CodecSegmenter(replace(BUSY, at_end=True))  # non-streaming windows keep their tiling
    assert at_end.push(available, done=True)[0] == Window(0, 10, 0, 15)


def test_a_busy_first_window_adds_no_new_recurring_size() -> None:
    """Both first windows' streams fall on sizes captured as graphs: 15 (lone) and 25 (busy, the
    same as a lone stream's second window), so a busy worker replays graphs like an idle one."""
    busy = CodecSegmenter(BUSY)
    assert busy.recurring_sizes() == CodecSegmenter(replace(BUSY, first_chunk_busy=0)).recurring_sizes()
    assert busy.recurring_sizes() == frozenset({15, 25, 35, 45, 55})
    assert busy.codes_to_cover() == 20 + 60 + 80 + 5
    lone = CodecSegmenter(replace(BUSY, first_chunk=20))  # a first window of 20 as a lone stream's
    assert {w.ctx_end - w.ctx_start for w in lone.push(200)} <= busy.recurring_sizes()


def test_without_first_chunk_busy_the_load_changes_nothing() -> None:
    seg = CodecSegmenter(replace(BUSY, first_chunk_busy=0))
    assert seg.push(15, streams=64) == [Window(0, 10, 0, 15)]


@pytest.mark.parametrize(
    ("setting", "first_chunk_busy", "busy_streams"),
    [(None, 20, 12), ("", 20, 12), ("4", 20, 4), ("1", 20, 1), ("0", 0, 12)],
)
def test_omni_busy_streams_moves_or_turns_off_the_busy_first_window(
    setting: str | None, first_chunk_busy: int, busy_streams: int
) -> None:
    from omni_runtime.pipeline.segmenter import with_busy_streams

    family = {"first_chunk": 10, "first_chunk_busy": 20, "busy_streams": 12}
    windows = with_busy_streams(family, setting)
    assert (windows["first_chunk_busy"], windows["busy_streams"]) == (first_chunk_busy, busy_streams)
    assert family["busy_streams"] == 12  # the family's own dict is left as it was


def test_omni_busy_streams_on_a_family_without_a_busy_window_changes_nothing() -> None:
    from omni_runtime.pipeline.segmenter import with_busy_streams

    assert with_busy_streams({"first_chunk": 4}, "8") == {"first_chunk": 4}


@pytest.mark.parametrize("setting", ["-1", "four", "2.5"])
def test_a_wrong_omni_busy_streams_names_itself_and_the_fix(setting: str) -> None:
    from omni_runtime.pipeline.segmenter import with_busy_streams

    with pytest.raises(
        ValueError, match=rf"^OMNI_BUSY_STREAMS is '{setting}', not a whole number of streams >= 0"
    ):
        with_busy_streams({"first_chunk_busy": 20}, setting)


def test_a_busy_first_window_can_have_a_ramp_of_its_own() -> None:
    """``ramp_busy``: after a busy first window of 20, windows of 10, 10, 20, 30 (instead of the
    ramp's 10, 20, 30); a lone stream keeps the ramp. Every size either cuts is a recurring one."""
    cfg = replace(BUSY, ramp_busy=(10, 10, 20, 30))
    planned = replace(cfg, catch_up=False)  # the planned tiling (all codes exist at once here)
    busy, lone = CodecSegmenter(planned), CodecSegmenter(planned)
    assert [(w.start, w.end) for w in busy.push(200, streams=12)] == [
        (0, 20), (20, 30), (30, 40), (40, 60), (60, 90), (90, 130), (130, 170),
    ]  # fmt: skip
    assert [(w.start, w.end) for w in lone.push(200)] == [
        (0, 10), (10, 20), (20, 40), (40, 70), (70, 110), (110, 150), (150, 190),
    ]  # fmt: skip
    sizes = CodecSegmenter(cfg).recurring_sizes()
    windows = CodecSegmenter(cfg).push(400, streams=12) + CodecSegmenter(cfg).push(400)
    assert {w.ctx_end - w.ctx_start for w in windows if w.ctx_end < 400} <= sizes
    from omni_runtime.pipeline.segmenter import family_config

    assert family_config({"ramp_busy": [10, 10, 20, 30]}).ramp_busy == (10, 10, 20, 30)


@pytest.mark.parametrize(
    ("available", "streams", "need"),
    [
        (0, 1, 15),  # a lone stream's first window: 10 codes and 5 of right context
        (12, 1, 3),
        (15, 1, 0),  # it can be cut now
        (40, 1, 0),  # more than enough: still 0, never negative
        (12, 12, 13),  # under load the first window is 20 codes: 25 to cut
        (25, 16, 0),
    ],
)
def test_codes_until_the_first_window_is_what_push_waits_for(available: int, streams: int, need: int) -> None:
    seg = CodecSegmenter(BUSY)
    assert seg.codes_until_first(available, streams=streams) == need
    cut = seg.push(available, streams=streams)
    assert bool(cut) == (need == 0)  # push cuts exactly when no code is missing
    if cut:
        assert seg.codes_until_first(available + 5, streams=streams) is None  # cut: none to wait for


def test_codes_until_first_is_none_where_windows_wait_for_the_end() -> None:
    assert CodecSegmenter(SegmenterConfig(at_end=True)).codes_until_first(0) is None
    assert CodecSegmenter(SegmenterConfig(whole=True)).codes_until_first(100) is None


def test_after_a_busy_first_window_the_early_windows_are_as_wide_as_it() -> None:
    """A busy first window of 22 codes has a context of 27; the next two windows (10 codes each,
    25 with their left context) take two more codes of left context, so the early windows of every
    busy stream are one size and the vocoder batches a new stream's first window with the others'
    second and third. The audio kept, and when each window is cut, do not change; a lone stream
    (first window 10, second window's context starting at code 0) keeps its sizes."""
    cfg = replace(BUSY, first_chunk_busy=22, ramp_busy=(10, 10, 20, 30))
    busy = CodecSegmenter(cfg)
    windows = [w for n in range(1, 141) for w in busy.push(n, streams=16)]
    assert windows == [
        Window(0, 22, 0, 27),
        Window(22, 32, 10, 37),  # left context 12, not 10
        Window(32, 42, 20, 47),
        Window(42, 62, 32, 67),  # 35 codes of context already: as planned
        Window(62, 92, 52, 97),
        Window(92, 132, 82, 137),
    ]
    lone = CodecSegmenter(cfg)
    assert [w for n in range(1, 26) for w in lone.push(n)] == [Window(0, 10, 0, 15), Window(10, 20, 0, 25)]
    assert busy.recurring_sizes() == frozenset({15, 25, 27, 35, 45, 55})


def test_steady_from_widens_the_ramp_to_the_steady_context_where_the_codes_exist() -> None:
    """``steady_from=3``: from the fourth window on, every window has the steady context (55)
    where the stream has that many codes, so a busy stream's windows have two sizes (27, 55) and
    the size 45 is gone. The audio kept is the planned tiling's."""
    cfg = replace(BUSY, first_chunk_busy=22, ramp_busy=(10, 10, 20, 30), steady_from=3)
    segmenter = CodecSegmenter(replace(cfg, catch_up=False))
    busy = [w for n in range(1, 141) for w in segmenter.push(n, streams=16)]
    assert busy == [
        Window(0, 22, 0, 27),
        Window(22, 32, 10, 37),
        Window(32, 42, 20, 47),
        Window(42, 62, 12, 67),  # 35 -> 55
        Window(62, 92, 42, 97),  # 45 -> 55
        Window(92, 132, 82, 137),
    ]
    lone_segmenter = CodecSegmenter(replace(cfg, catch_up=False))
    lone = [w for n in range(1, 76) for w in lone_segmenter.push(n)]
    assert [w.ctx_end - w.ctx_start for w in lone] == [15, 25, 35, 55]  # windows 0-2 come before it
    assert CodecSegmenter(cfg).recurring_sizes() == frozenset({15, 25, 27, 35, 55})
    assert CodecSegmenter(replace(cfg, steady_from=0)).recurring_sizes() == frozenset(
        {15, 25, 27, 35, 45, 55}
    )


@pytest.mark.parametrize("steady_from", [0, 1, 3])
def test_widening_never_reaches_before_the_first_code(steady_from: int) -> None:
    """Short streams, busy and lone: a window is widened only where the codes exist (a busy
    reply that ends at 24 codes keeps its second window's context at [12, 24), not [-3, 24))."""
    cfg = replace(BUSY, first_chunk_busy=22, ramp_busy=(10, 10, 20, 30), steady_from=steady_from)
    for streams in (1, 16):
        for total in range(1, 80):
            windows = CodecSegmenter(cfg).push(total, done=True, streams=streams)
            assert all(w.ctx_start >= 0 for w in windows), (streams, total, windows)
    assert CodecSegmenter(cfg).push(24, done=True, streams=16) == [
        Window(0, 22, 0, 24),
        Window(22, 24, 12, 24),
    ]
    lone = CodecSegmenter(cfg).push(25, streams=1)  # a lone stream's second window: 25 codes exist
    assert lone == [Window(0, 10, 0, 15), Window(10, 20, 0, 25)]


def test_steady_from_with_catch_up_takes_every_code_up_to_the_steady_size() -> None:
    """Catch-up cuts a window at a recurring context size. Where ``steady_from`` widens it to the
    steady size anyway, it takes every code that exists up to that size instead of stopping at
    the largest smaller recurring one."""
    cfg = replace(BUSY, first_chunk_busy=22, ramp_busy=(10, 10, 20, 30))

    def cut(config: SegmenterConfig) -> list[Window]:
        segmenter = CodecSegmenter(config)
        return [w for n in (27, 37, 47, 80) for w in segmenter.push(n, streams=16)]

    assert cut(cfg)[-1] == Window(42, 72, 32, 77)  # 45 is recurring: 30 codes
    assert cut(replace(cfg, steady_from=3))[-1] == Window(42, 75, 25, 80)  # 33 codes, widened to 55
