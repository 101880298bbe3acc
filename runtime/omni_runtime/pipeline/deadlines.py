"""Deadline order for vocoder windows: the stream closest to an underrun goes first.

Many speech streams share one vocoder; it takes at most a few windows per call, so when more
windows wait than fit, the order decides who stalls. First-come-first-served lets a stream with
seconds of audio buffered at the listener go ahead of one about to run dry. Instead:

- a stream's **first window** goes before every later window (its listener hears nothing yet:
  time to first audio is the number everyone sees), first windows among themselves in arrival order;
- later windows go by **playback deadline**: the moment the listener's play head reaches the end
  of the audio already sent, assuming playback started at the stream's first audio and waited
  (stalled) whenever audio came late, exactly as ``omni bench`` plays a stream back. The earliest
  deadline first; equal deadlines in arrival order.

A window carries its stream's *slack* (seconds until that deadline, None for a first window)
rather than a clock reading, so the order also holds when the vocoder runs in another process
(the talker stage behind a stage link) with a clock of its own. A stream may have a second
window at the vocoder while its first is still there (the engine's ``windows_ahead``); that one
carries the slack it will have once the first is out (`ahead_slack`), so it is a later window, not
a first one.

The same slack decides whether a window **holds the thinker** (`holds_thinker`) where the vocoder
shares the thinker's GPU: a window is a few thousand small kernels, and queued behind the
thinker's weight-streaming GEMMs it takes two to three times as long. A first window always holds
it (time to first audio); a later one only when its listener would otherwise run dry soon. The
hold is not free: while the thinker's text lasts, the talker consumes one thinker vector per code,
so pausing the thinker also pauses the codes of every stream still in its text.

Pure: the engine keeps a `PlaybackClock` per stream; the vocoder's worker orders by `priority`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from omni_runtime.contract import switches

T = TypeVar("T")

Priority = tuple[int, float, int]
# A later window holds the thinker when its listener has less than this many seconds of audio left
# (with the 10-code first window, one H100: 16 streams stalled 0.42 s each instead of 0.51 s).
THINKER_HOLD_BELOW_S = 0.3


@dataclass
class PlaybackClock:
    """Where one stream's listener is: when the audio sent so far runs out (server clock)."""

    ends_at: float | None = None  # None: no audio sent yet

    def sent(self, *, now: float, seconds: float) -> None:
        """Audio of `seconds` left the server at `now`: it plays after what is queued, or at once
        if the listener already ran dry (a stall)."""
        start = now if self.ends_at is None else max(self.ends_at, now)
        self.ends_at = start + seconds

    def slack(self, *, now: float) -> float | None:
        """Seconds until the listener runs out of audio (negative: already stalled); None before
        the first audio."""
        return None if self.ends_at is None else self.ends_at - now


def ahead_slack(slack_s: float | None, queued_s: float) -> float | None:
    """The slack of a window cut while ``queued_s`` seconds of its stream's audio are still being
    synthesised: its listener's slack once that audio is out, counted as if it went out now (the
    play head, stalled or not, then has that much more to play). ``slack_s`` is the stream's
    slack now (None before its first audio); with nothing queued it is the window's own."""
    if queued_s <= 0:
        return slack_s
    return max(slack_s or 0.0, 0.0) + queued_s


def priority(*, slack_s: float | None, now: float, seq: int) -> Priority:
    """Sort key of a window submitted at `now` (smaller runs first); `seq` is the arrival number."""
    if slack_s is None:
        return (0, 0.0, seq)  # a first window
    return (1, now + slack_s, seq)


def holds_thinker(
    *,
    slack_s: float | None,
    below_s: float | None,
    first_audio_pending: bool = False,
    text_pending: bool = False,
) -> bool:
    """Whether a window with this slack pauses the thinker while it is synthesised.

    ``below_s`` is the engine's setting: None never holds (the vocoder has a GPU of its own);
    otherwise a first window (slack None) holds, and a later one when its listener has less than
    ``below_s`` seconds of audio left (``float("-inf")``: first windows only).

    ``first_audio_pending``: some other reply has not reached its first audio yet and needs the
    thinker for it (a prompt waiting for its prefill, or a stream whose talker still waits for
    text to make its first window). A later window then never holds, as it never goes before a
    first window in the vocoder's line: pausing the thinker for a listener with audio left would
    delay the first audio of one who hears nothing yet. Measured on an H100 under 8 realtime
    sessions: new turns waited for such holds before their prefill (thinker admissions of 56 ms
    on average, 16% of them over 0.1 s) and for their first codes after it.

    ``text_pending``: another reply's talker still takes the thinker's text, one vector per code
    (a Qwen2.5 reply's first codes come no faster than its text). A later window then does not
    hold either: the pause would cost every such reply its next codes, for one window's sake. On
    an H200 at 32 streams, holds for later windows had paused the thinker 4 s of a 15 s level,
    a reply's text came at 32 tokens a second against the 50 codes a second playback needs, and
    each stream stalled 1.17 s; with first windows alone holding, 37 tokens a second and 0.82 s.
    """
    if below_s is None:
        return False
    if slack_s is None:
        return True
    return slack_s < below_s and not first_audio_pending and not text_pending


# A first window that is ready waits for other replies' first windows this many codes (or fewer)
# from being cut, at most FIRST_LINGER_S, so they go to the vocoder in one call (`lingers`).
FIRST_LINGER_CODES = 8
FIRST_LINGER_S = 0.03


def lingers(others_need: Iterable[int | None], *, within: int, waiting: bool = False) -> bool:
    """Whether a reply's first window, ready to go to the vocoder, waits for another reply's:
    some other reply still needs ``1..within`` codes before its own is cut
    (``CodecSegmenter.codes_until_first``; 0: cut now, on its way; None: cut already, or not
    streaming), and no other first window is ``waiting`` already (then this one is the company
    that one waited for: both go now). ``within`` 0 never waits. The caller waits until the next
    first window goes, bounded by ``FIRST_LINGER_S``.

    In a wave of replies that start together, one prompt is prefilled alone before the rest and
    its first window is cut a code or two before theirs. Sent at once, it ran in a vocoder call of
    its own; the others' first windows, cut a thinker step later, waited for that call and then
    ran in their own. That reply's listener then started about 0.1 s before its wave, while its
    later windows, whose codes come at the thinker's text rate like everyone's, came with the
    wave's: it was the stream that stalled. Waiting a step or two for the next first window puts
    both in one call, with every other first window cut in that same talker step; one cut a step
    later starts a group of its own."""
    if within <= 0 or waiting:
        return False
    return any(need is not None and 0 < need <= within for need in others_need)


@dataclass(frozen=True)
class FarWindows:
    """A bound on how long a vocoder call runs while its windows have audio to spare.

    A later window is *far* when its listener still has more than ``after_s`` seconds of audio
    (its deadline is that far off). A far window does not ride along in a call made for a nearer
    one, and a call of far windows alone takes at most ``batch`` of them. Under a closed loop the
    vocoder makes audio faster than it plays, so most windows are far; in full calls of them (14
    windows, about 180 ms on an H200) a window that had just become urgent waited for the whole
    call in flight, then its own. Smaller calls cost batching efficiency: off unless set.

    ``near_only``: the bound holds only while some live stream is *near* (less than ``after_s``
    of audio left, or none yet; `near_streams`): the windows that could turn urgent during a long
    call are those of young streams. When every stream has more than ``after_s`` queued (a closed
    loop past its ramp), far windows go in full calls. Without it the bound always holds: on one
    H100, in-process, that cost 16 streams started together 4 and 16 of 32 real time in two calls
    (fewer windows a call, less audio a second). ``near_only`` kept them 32 of 32, and under
    Poisson arrivals (2 a second, 98 replies) kept 62 streams real time against 53 with no bound
    (docs/benchmarks.md), for replies that end later (their far windows wait): latency p50 4.1 →
    6.7 s, every window still before its listener needed it. Opt-in until measured through HTTP."""

    after_s: float
    batch: int
    near_only: bool = False


def near_streams(slacks: Iterable[float | None], *, within_s: float) -> bool:
    """Whether any live stream is near: its slack (seconds of audio its listener has left, None
    before its first audio) is None or under ``within_s``."""
    return any(slack is None or slack < within_s for slack in slacks)


def far_windows(setting: str | None) -> FarWindows | None:
    """``OMNI_VOCODER_FAR``'s value, ``"AFTER_S,BATCH[,near]"`` (e.g. ``"1.0,4,near"``), as a
    `FarWindows`; unset, empty or ``off``: None (every call as full as the line allows). A wrong
    value raises ValueError in the switch's words (contract.switches)."""
    value = switches.parse("OMNI_VOCODER_FAR", setting)
    if value is None or value == "off":
        return None
    return FarWindows(after_s=value[0], batch=value[1], near_only=value[2])


def take(
    waiting: Sequence[tuple[Priority, T]],
    max_batch: int,
    *,
    group: Callable[[T], Hashable] | None = None,
    far: FarWindows | None = None,
    now: float = 0.0,
    near: bool = True,
) -> tuple[list[T], list[tuple[Priority, T]]]:
    """The next batch (most urgent first, at most `max_batch`) and what keeps waiting.

    With `group`, the batch holds only items of the most urgent one's group (a vocoder window's
    shape: windows of different shapes would run one after another inside the call, and a window
    that comes meanwhile, however urgent, would wait for all of them); the others keep their place.
    With `far` (and the clock's `now`), far windows stay out of a nearer one's call, and a call of
    far windows takes at most `far.batch` (`FarWindows`); with `far.near_only`, only while `near`
    (some live stream is near, `near_streams`).
    """
    ordered = sorted(waiting, key=lambda entry: entry[0])
    if not ordered:
        return [], []

    def is_far(key: Priority) -> bool:
        return far is not None and key[0] == 1 and key[1] - now > far.after_s

    lead_far = is_far(ordered[0][0])
    bounded = far is not None and lead_far and (near or not far.near_only)
    limit = min(max_batch, far.batch) if far is not None and bounded else max_batch
    first = group(ordered[0][1]) if group is not None else None
    batch: list[T] = []
    rest: list[tuple[Priority, T]] = []
    for key, item in ordered:
        same = group is None or group(item) == first
        if len(batch) < limit and same and (lead_far or not is_far(key)):
            batch.append(item)
        else:
            rest.append((key, item))
    return batch, rest
