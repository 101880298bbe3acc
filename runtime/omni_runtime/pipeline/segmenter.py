"""The segmenter stage's pure part: cutting a growing codec-token stream into vocoder windows.

The talker emits codec tokens one by one while the thinker is still writing; the vocoder turns
a span of codes into audio. Streaming speech synthesises each span as soon as the codes after
it (the right context the vocoder's attention looks at) exist, with a few codes of left context
so the joins are smooth. The first span is short so the first audio leaves early; later spans
are longer because each vocoder call has a fixed cost.

Under load a stream's windows wait for the vocoder, and meanwhile its talker keeps going: by the
time the next window is cut, more codes may exist than that window's planned size. ``catch_up``
then cuts one larger window over what exists (up to the steady size) instead of several small
ones queued one after another, each waiting a whole vocoder call: fewer calls per second of
audio, and the listener's buffer grows by more per call. Its context size is always one of the
recurring sizes, so it runs as a captured CUDA graph like the planned windows.

Non-streaming speech (``at_end``) cuts the finished stream into the same windows at once, not
into one window over every code: each window is a vocoder call of bounded size, so a cancel
drops the ones not yet run instead of waiting seconds for one eager call over the utterance,
and the windows are the sizes streaming captures as CUDA graphs (batched together).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from omni_runtime.contract import switches


@dataclass(frozen=True)
class Window:
    """Synthesize codes ``[ctx_start, ctx_end)`` and keep the audio of ``[start, end)``."""

    start: int
    end: int
    ctx_start: int
    ctx_end: int


@dataclass(frozen=True)
class SegmenterConfig:
    first_chunk: int = 5  # codes in the first window (50 codes = 1 s of Qwen2.5-Omni audio)
    chunk: int = 40  # codes in each later window
    # Sizes of the windows between the first and the steady ``chunk`` ones: growing windows let
    # the talker, which makes audio only somewhat faster than real time under load, stay ahead
    # of playback while the buffer is still short (a 4-code window plays 0.32 s of Qwen3 audio; a
    # 15-code one then takes longer than that to make at real-time factor 0.5).
    ramp: tuple[int, ...] = ()
    # Under load a longer first window: while the worker carries at least ``busy_streams``
    # streaming speech replies, the first window holds ``first_chunk_busy`` codes (0: always
    # ``first_chunk``). The second window's codes and its vocoder call (batched with every other
    # stream's) must arrive before the first window has played: at 16 streams on an H100 that
    # round trip is about 0.3 s, longer than 10 codes of audio, so almost every stream stalled
    # there; 20 codes cover it at about 70 ms more first-audio latency (docs/benchmarks.md). A lone
    # stream keeps the short first window. Decided when the first window is cut, under the replies
    # the engine has accepted and not yet ended (one still in its prompt counts), so a stream of a
    # wave that starts together sees the others, and so does one that starts as others end.
    first_chunk_busy: int = 0
    busy_streams: int = 0
    ramp_busy: tuple[int, ...] = ()  # the ramp after a busy first window (empty: ``ramp``)
    left_context: int = 10
    right_context: int = 5
    # Non-streaming: the streaming windows, all at once when the stream ends. ``whole`` instead
    # makes one window over every code (one uninterruptible call; kept for comparison).
    at_end: bool = False
    whole: bool = False
    # Cut a window over every code that exists (up to the steady size, at a recurring context
    # size) rather than the planned size alone; False keeps the planned sizes (for comparison).
    catch_up: bool = True
    # Windows from this index on (the first is 0) take the steady window's context where the
    # stream has the codes (more left context), so the ramp's windows share the steady ones'
    # vocoder batches; a catch-up window among them takes every code up to the steady size. The
    # planned windows keep their audio. 0: off. To measure with streams out of phase (Poisson
    # arrivals), where each context size is a call of its own; not a default.
    steady_from: int = 0


def family_config(windows: Mapping[str, Any], *, at_end: bool = False) -> SegmenterConfig:
    """The default windows with a model family's overrides (``OmniAdapter.codec_windows``)."""
    fields: dict[str, Any] = {**windows, "at_end": at_end}
    for name in ("ramp", "ramp_busy"):  # a list from JSON (a bench variant) or a tuple: kept a tuple
        if name in fields:
            fields[name] = tuple(int(size) for size in fields[name])
    return SegmenterConfig(**fields)


def with_busy_streams(windows: Mapping[str, Any], setting: str | None) -> dict[str, Any]:
    """A family's windows with ``OMNI_BUSY_STREAMS`` applied: from how many streaming speech
    replies on the first window holds ``first_chunk_busy`` codes; ``0`` keeps the short first
    window at any load; unset or empty: the family's own. A wrong value raises ValueError in the
    switch's words (contract.switches)."""
    out = dict(windows)
    streams = switches.parse("OMNI_BUSY_STREAMS", setting)
    if streams is None:
        return out
    if streams == 0:
        out["first_chunk_busy"] = 0
    elif out.get("first_chunk_busy"):
        out["busy_streams"] = streams
    return out


class CodecSegmenter:
    """Tracks how many codes exist and yields the windows that became ready."""

    def __init__(self, config: SegmenterConfig | None = None) -> None:
        self.config = config or SegmenterConfig()
        self._next = 0  # first code not yet covered by an emitted window
        self._sizes: frozenset[int] | None = None  # recurring context sizes (catch-up windows)
        self._first: int | None = None  # codes the first window took, once cut
        self.first_busy = False  # the first window was cut at ``first_chunk_busy`` (under load)

    def recurring_sizes(self) -> frozenset[int]:
        """Context sizes (``ctx_end - ctx_start``) of the windows every long stream starts with:
        the first, the second (its left context is cut short by the stream's start) and the
        steady one. These recur across requests, so they are worth a CUDA graph each."""
        sizes: set[int] = set()
        for streams in {1, max(1, self.config.busy_streams)}:  # a lone stream's first window, a busy one's
            probe = CodecSegmenter(replace(self.config, whole=False, at_end=False, catch_up=False))
            windows = probe.push(self.codes_to_cover(), streams=streams)
            sizes.update(w.ctx_end - w.ctx_start for w in windows)
        return frozenset(sizes)

    def codes_to_cover(self) -> int:
        """Codes a stream needs so that every recurring window size has occurred once."""
        cfg = self.config
        ramp = max(sum(cfg.ramp), sum(cfg.ramp_busy))
        return max(cfg.first_chunk, cfg.first_chunk_busy) + ramp + 2 * cfg.chunk + cfg.right_context

    @property
    def busy_size(self) -> int | None:
        """The context size of a busy first window; None without one. After a busy first window,
        a later window whose context is shorter takes more left context (codes the stream has) to
        be as long: the early windows of busy streams are then one size, and the vocoder runs one
        size in one batch, so a stream arriving while others are in their second and third windows
        has its first window batched with theirs. Only the left context grows; the audio kept, and
        when the window can be cut, are unchanged."""
        cfg = self.config
        return cfg.first_chunk_busy + cfg.right_context if cfg.first_chunk_busy else None

    @property
    def emitted_until(self) -> int:
        return self._next

    def push(
        self, available: int, *, done: bool = False, limit: int | None = None, streams: int = 1
    ) -> list[Window]:
        """``available`` codes exist now; ``done`` once the talker has finished. At most ``limit``
        windows (None: every window that is ready); the rest are cut by a later call, over the
        codes that exist then. ``streams``: the streaming speech replies the worker carries now
        (this one included), which sizes the first window (``first_chunk_busy``)."""
        cfg = self.config
        windows: list[Window] = []
        if cfg.whole:
            if done and available > self._next:
                windows.append(Window(self._next, available, self._next, available))
                self._next = available
            return windows
        if cfg.at_end and not done:
            return windows
        while self._next < available and (limit is None or len(windows) < limit):
            planned = (
                self._first_cut(streams, available)
                if self._next == 0
                else self._size(self._index(self._next))
            )
            end = self._next + planned
            if end + cfg.right_context > available:
                if not done:
                    break
                end = min(end, available)
            ctx_start = max(0, self._next - cfg.left_context)
            steady = self._steady_size() if self._next > 0 else None
            if cfg.catch_up and self._next > 0:
                cap = max(planned, cfg.chunk)
                end = self._catch_up(end, ctx_start, available, cap=cap, done=done, steady=steady)
            ctx_end = min(available, end + cfg.right_context)
            if self.first_busy:  # the early windows of busy streams: one vocoder batch size
                ctx_start = _widened(ctx_start, ctx_end, self.busy_size)
            if steady is not None:
                ctx_start = _widened(ctx_start, ctx_end, steady)
            windows.append(Window(self._next, end, ctx_start, ctx_end))
            if self._next == 0:
                self._first = end
                self.first_busy = planned != cfg.first_chunk and planned == cfg.first_chunk_busy
            self._next = end
        return windows

    def codes_until_first(self, available: int, *, streams: int = 1) -> int | None:
        """Codes this stream still needs before its first window can be cut (0: it can be cut
        now, as ``push`` would with the same ``streams``); None once it has been cut, and for
        non-streaming windows (cut only when the talker ends)."""
        cfg = self.config
        if self._next > 0 or cfg.whole or cfg.at_end:
            return None
        return max(0, self._first_size(streams) + cfg.right_context - available)

    def _first_cut(self, streams: int, available: int) -> int:
        """The first window's size: ``_first_size`` under this load, or, with catch-up on, the
        busy size wherever its codes (and right context) exist already. Push is called as each
        code comes, so that happens only when the load fell while the stream waited for a busy
        first window (the others ended): its codes are there, and a short first window would
        leave its listener 0.2 s of audio while the vocoder still serves the others."""
        cfg = self.config
        size = self._first_size(streams)
        busy = cfg.first_chunk_busy
        if cfg.catch_up and not cfg.at_end and size < busy <= available - cfg.right_context:
            return busy
        return size

    def _first_size(self, streams: int) -> int:
        cfg = self.config
        busy = cfg.first_chunk_busy > 0 and streams >= max(1, cfg.busy_streams)
        return cfg.first_chunk_busy if busy else cfg.first_chunk

    def _steady_size(self) -> int | None:
        """The steady window's context size where ``steady_from`` widens the window starting at
        the next code to it; None where it does not."""
        cfg = self.config
        if not cfg.steady_from or self._index(self._next) < cfg.steady_from:
            return None
        return cfg.left_context + cfg.chunk + cfg.right_context

    def _catch_up(
        self, end: int, ctx_start: int, available: int, *, cap: int, done: bool, steady: int | None = None
    ) -> int:
        """The farthest end past the planned ``end``, at most ``cap`` codes from the window's
        start, whose context (with its full right context) is a recurring size; the planned end
        if none is. Once the stream is done, the rest in one window if it fits under ``cap``.
        With ``steady`` (`_steady_size`), any end whose context reaches it: the window is widened
        to that size, so the farthest end within ``cap`` is."""
        if done and available - self._next <= cap:
            return available
        right = self.config.right_context
        farthest = min(self._next + cap, available - right)
        if steady is not None and farthest > end and farthest + right >= steady:
            return farthest
        if self._sizes is None:
            self._sizes = self.recurring_sizes()
        fits = [
            size + ctx_start - right for size in self._sizes if end < size + ctx_start - right <= farthest
        ]
        return max(fits, default=end)

    def _index(self, position: int) -> int:
        """Which planned window a window starting at ``position`` is: how many windows of the
        planned tiling (first, ramp, steady) end at or before it. A catch-up window moves the
        ramp on by every planned window it covered."""
        index, end = 0, 0
        while True:
            end += max(1, self._size(index))
            if end > position:
                return index
            index += 1

    def _size(self, index: int) -> int:
        """Codes in window ``index``: the first (as cut, once it is), then the ramp, then the
        steady chunk."""
        cfg = self.config
        if index == 0:
            return cfg.first_chunk if self._first is None else self._first
        ramp = cfg.ramp_busy if self.first_busy and cfg.ramp_busy else cfg.ramp
        return ramp[index - 1] if index - 1 < len(ramp) else cfg.chunk


def _widened(ctx_start: int, ctx_end: int, size: int | None) -> int:
    """``ctx_start`` moved left so the context ``[ctx_start, ctx_end)`` is ``size`` codes long,
    where it is shorter and the stream has that many codes before ``ctx_end``; else unchanged."""
    if size is not None and ctx_end - ctx_start < size <= ctx_end:
        return ctx_end - size
    return ctx_start


def widen_to_recurring(window: Window, sizes: frozenset[int], *, prefer: int | None = None) -> Window:
    """A window of a one-off context size (a stream's last), widened to the left to the smallest
    recurring size that fits, so it runs as an already captured graph instead of eagerly.

    ``prefer`` (`CodecSegmenter.busy_size`), where it fits, wins over a smaller size: the vocoder
    batches one size per call, and the early windows of busy streams are that size, so a last
    window of it joins their calls. Widened to a size of its own, a lone stream's last window went
    only when it was the most urgent: on an H100 under Poisson arrivals its last 0.2 s came 2-4 s
    after the rest (before its listener needed it, but that late to the reply's end).

    The kept span ``[start, end)`` is unchanged; only the left context grows, with codes the
    stream really has (``ctx_start`` stays >= 0). A window that fits no recurring size is kept.
    """
    size = window.ctx_end - window.ctx_start
    fits = [s for s in sizes if size < s <= window.ctx_end]
    if size in sizes or not fits:
        return window
    target = prefer if prefer in fits else min(fits)
    return replace(window, ctx_start=window.ctx_end - target)


def window_item(
    codes: list[int],
    window: Window,
    *,
    voice: str | None,
    seed: int,
    sizes: frozenset[int],
    slack_s: float | None = None,
) -> dict[str, Any]:
    """One vocoder item: the codes so far and the window of them to synthesise.

    ``slack_s`` is the stream's playback slack (`pipeline.deadlines`); None puts the window with
    first windows, as every window of a non-streaming reply is (its listener hears nothing yet).
    """
    return {
        "codes": list(codes),
        "window": {
            "start": window.start,
            "end": window.end,
            "ctx_start": window.ctx_start,
            "ctx_end": window.ctx_end,
        },
        "voice": voice,
        "seed": seed,
        # Windows mostly come in a few recurring sizes (first, second, steady): worth a CUDA graph.
        "reusable": window.ctx_end - window.ctx_start in sizes,
        "slack_s": slack_s,
    }
