"""Cutting the codec stream into vocoder windows: exact windows for streaming and whole mode."""

from __future__ import annotations

from omni_runtime.pipeline.segmenter import CodecSegmenter, SegmenterConfig, Window

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
