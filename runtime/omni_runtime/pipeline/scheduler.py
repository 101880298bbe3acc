"""Continuous batching for the thinker: fixed slots, requests join and leave between decode steps.

Every iteration of the loop (1) drops finished and cancelled rows and compacts the survivors
into slots ``0..n-1`` (so one decode step covers exactly the running batch), (2) prefills
waiting requests into the next free slots, sending each one's first token at once, and (3) runs
one decode step for all rows. The model work of an iteration runs on the thinker's thread; all
bookkeeping stays on the event loop, so a cancel (a client closing its stream) needs no locks
and frees its slot at the next step boundary.

While the batch stays as it is and no row feeds a talker (``queue_ahead``), each decode step is
queued on the GPU before the previous step's tokens are read (a runner with ``launch``;
``OMNI_THINKER_AHEAD``): the host's work between steps (the tokens' copy and wait, the hand-over to
the event loop and back, the tokens' dispatch) then runs while the GPU computes, instead of between
its steps. A row that samples its end token has one more step computed that nobody reads; any
change (a row ending or cancelled, an admission due, a hold) first collects the step in flight,
then goes on as above. Speech rows keep one step at a time: their audio windows pause the thinker
(``hold``), and a step queued ahead would run into the window it pauses for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from omni_runtime.contract.adapter import (
    RowSampling,
    ThinkerAdmission,
    ThinkerPrompt,
    ThinkerRunner,
    ThinkerStep,
)
from omni_runtime.pipeline.conversation_kv import (
    ConversationKV,
    KeptPrefix,
    decode_positions,
    positions_of,
    reusable_length,
)
from omni_runtime.pipeline.workers import SchedulerLoop, StageThread

log = logging.getLogger(__name__)

FinishReason = Literal["stop", "length", "cancelled", "error"]


@dataclass(frozen=True)
class ThinkerToken:
    token: int
    vector: Any = None  # the talker's reply vector of the *previous* token (fed in this step)


@dataclass(frozen=True)
class ThinkerDone:
    reason: FinishReason
    error: str | None = None


@dataclass(eq=False)
class ThinkerJob:
    request_id: str
    prompt: ThinkerPrompt
    sampling: RowSampling
    max_tokens: int
    ignore_eos: bool = False
    want_vectors: bool = False
    session: str | None = None  # conversation KV key: the row's KV is kept for the next turn
    events: asyncio.Queue[ThinkerToken | ThinkerDone | tuple[str, Any]] = field(default_factory=asyncio.Queue)
    # Scheduler state (event-loop side only).
    slot: int = -1
    length: int = 0  # tokens in the cache
    generated: int = 0
    finish: FinishReason | None = None
    prompt_vectors: Any = None
    # Conversation KV (session rows only): the kept entry taken at admission, the tokens
    # sampled (the cache holds the prompt, then sampled[: length - prompt]), the talker vectors
    # of the fed tokens, and the prompt positions served from kept KV.
    kept: KeptPrefix | None = None
    kept_length: int = 0
    sampled: list[int] = field(default_factory=list)
    fed_vectors: list[Any] = field(default_factory=list)
    reused: int = 0
    seed: bool = False  # reused no shared prefix: its prompt's KV is offered as one when it ends


def plan_compaction(
    slots: list[int | None], leaving: set[int]
) -> tuple[list[tuple[int, int]], list[int | None]]:
    """Moves that make the surviving rows dense again.

    ``slots[i]`` is the row id in slot i (None: free). Returns (moves as (src, dst), new slots):
    each hole below the new batch size is filled from the highest occupied slot above it.
    """
    table = [None if row in leaving else row for row in slots]
    survivors = sum(row is not None for row in table)
    moves: list[tuple[int, int]] = []
    high = len(table) - 1
    for dst in range(survivors):
        if table[dst] is not None:
            continue
        while table[high] is None:
            high -= 1
        moves.append((high, dst))
        table[dst], table[high] = table[high], None
    return moves, table[:survivors]


def queue_ahead(
    *,
    lengths: list[int],
    left: list[int],
    max_len: int,
    ended: bool,
    admissions_due: bool,
    held: bool,
    feeds_talker: bool,
) -> bool:
    """Whether the thinker may queue a decode step while one step's tokens are still unread: the
    batch stays as it is (no row ``ended``, no admission due, no hold asked for), no row feeds a
    talker (speech: its audio windows pause the thinker, and a step queued ahead would still run
    in the pause), and the queued step is one every row needs and has room for. ``lengths`` and
    ``left`` (tokens still wanted, ``max_tokens - generated``) are each row's as the event loop
    knows them, one step before the queued one: that step takes each row's token ``left - 1`` to
    go, so the queued one is needed if ``left >= 2``, and it writes position ``length + 1``, so the
    cache must hold ``length + 2`` (its view)."""
    if ended or admissions_due or held or feeds_talker or not lengths:
        return False
    return all(n >= 2 for n in left) and all(length + 2 <= max_len for length in lengths)


def launches(runner: object) -> bool:
    """Whether ``runner``'s class has ``launch`` (a step queued, its tokens read later). Read off the
    class: the thinker TP runner passes unknown attributes through to its rank-0 runner, and steps
    queued ahead across a TP group (the followers' headers and broadcasts) are not checked yet, so it
    takes one step at a time."""
    return callable(getattr(type(runner), "launch", None))


def gather_wait(
    *, running: int, waiting: int, incoming: int, free: int, waited_s: float, gather_s: float
) -> float:
    """How long an idle thinker holds the admission of ``waiting`` prompts for the ``incoming`` ones
    still in their prompt phase (preprocessing, encoders, aggregation), so that a burst prefills
    as one batch; 0: admit now. Without a hold, the first prompt of a burst is prefilled alone and
    the rest wait for that iteration to end (on an H200 at 16 streams: the first text of one reply
    at 40-55 ms, of the other 15 at 90-116 ms). The hold is counted from when the oldest waiting
    prompt was submitted (``waited_s``) and is never taken while rows are running (a decode step
    is due), when nothing is coming, or when the waiting prompts already fill the free slots."""
    if gather_s <= 0 or running or not waiting or not incoming or waiting >= free:
        return 0.0
    return max(0.0, gather_s - waited_s)


class ThinkerScheduler(SchedulerLoop[ThinkerJob]):
    task_name = "thinker-scheduler"

    def __init__(
        self,
        runner: ThinkerRunner,
        *,
        thread: StageThread,
        max_batch: int,
        max_len: int,
        eos_token_ids: tuple[int, ...],
        prefill_token_budget: int = 8192,
        session_kv_bytes: int = 0,
        gather_s: float = 0.0,
        incoming: Callable[[], int] = lambda: 0,
        shared_prefixes: bool = False,
        ahead: bool = False,
    ) -> None:
        super().__init__()
        # Steps queued before the previous one's tokens are read (queue_ahead): whether this runner
        # may (a runner without ``launch``: never), and the step in flight.
        self.ahead = ahead and launches(runner)
        self._pending: Any = None
        self.steps_ahead = 0  # decode steps queued while another's tokens were unread
        # A burst's prompts prefilled together (gather_wait): ``incoming`` counts the requests
        # still in their prompt phase (the engine's), ``gather_s`` bounds the hold (0: none).
        self.gather_s = gather_s
        self.incoming = incoming
        self.admissions = 0  # prefills (each admits one or more rows)
        # Prompt prefixes shared across requests (conversation_kv: shared prefixes), in the same store.
        self.shared_prefixes = shared_prefixes
        self.runner = runner
        self.thread = thread
        self.max_batch = min(max_batch, runner.slots)
        self.max_len = max_len
        self.eos = frozenset(eos_token_ids)
        self.prefill_token_budget = prefill_token_budget
        # Conversation KV: only a runner that can copy a slot's KV out and back keeps any.
        keeps = bool(getattr(runner, "keeps_kv", False))
        self.kv = ConversationKV(session_kv_bytes if keeps else 0)
        self.running: list[ThinkerJob] = []  # running[i].slot == i
        self.max_running_batch = 0
        self.steps = 0
        self.rows_stepped = 0  # sum of the batch over steps: rows_stepped / steps is the mean batch
        self.cancelled = 0  # rows (running or waiting) finished by a cancel
        self._holds = 0
        self._held_since = 0.0
        self.held_s = 0.0  # seconds the thinker spent paused by holds (the engine's audio windows)
        self._resume = asyncio.Event()
        self._resume.set()

    # -- API used by the engine -------------------------------------------------------------------
    def finish(self, job: ThinkerJob, reason: FinishReason) -> None:
        """Stop a request (client gone, stop string hit); its slot is freed before the next step."""
        if job.finish is not None:
            return
        self._unqueue(job)
        if reason == "cancelled":
            self.cancelled += 1
            if job in self.running:  # the step in flight is the last one it takes part in
                self.thread.note_cancel()
        self._end(job, reason)
        self._wake.set()

    def end_session(self, session: str) -> None:
        """Forget a session's kept KV (closed); its rows still queued or running keep none."""
        self.kv.drop(session)
        for job in (*self.waiting, *self.running):
            if job.session == session:
                job.session = None

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Pause decode steps while the body runs (between steps: the one in flight finishes).

        The engine holds the thinker while a request's first audio window (and a later one whose
        listener is about to run dry: deadlines.holds_thinker) is synthesised on the GPU the
        thinker shares: a window is thousands of small vocoder kernels, and queued behind the
        thinker's weight-streaming GEMMs it took twice as long. The pause is not free: while a
        reply's text lasts, its talker consumes one thinker vector per code. ``held_s`` adds up
        the time paused.
        """
        self._holds += 1
        if self._holds == 1:
            self._held_since = time.monotonic()
        self._resume.clear()
        try:
            yield
        finally:
            self._holds -= 1
            if self._holds == 0:
                self.held_s += time.monotonic() - self._held_since
                self._resume.set()

    @property
    def waiting_count(self) -> int:
        return len(self.waiting)

    @property
    def running_count(self) -> int:
        return sum(j.finish is None for j in self.running)

    @property
    def active(self) -> int:
        return len(self.waiting) + sum(j.finish is None for j in self.running)

    # -- the loop ---------------------------------------------------------------------------------
    async def _iteration(self) -> None:
        if self._pending is not None:  # a step in flight: queue the next one, or collect it first
            await self._next_pending()
            return
        await self._resume.wait()
        loop = asyncio.get_running_loop()
        ended = [j for j in self.running if j.finish is not None]
        keep = [j for j in ended if self._keeps(j) or self._seeds(j)]
        if keep:  # before the moves and admissions that reuse the slots
            kept = await self.thread.run(self._keep, keep)
            for job, entry in zip(keep, kept, strict=True):
                if entry is not None and job.session is not None:
                    self.kv.put(job.session, entry)
                elif entry is not None:
                    self.kv.share(entry)
        # Ended rows leave only now: until their KV is kept, the batch is not quiet. A row that
        # ended during the copy stays for the next iteration, which keeps it.
        moves = self._drop_finished({id(j) for j in ended})
        if hold := self._gather_hold():
            assert not moves  # held only with no row running: nothing was compacted
            self._wake.clear()
            with contextlib.suppress(TimeoutError):  # a submit wakes it sooner
                await asyncio.wait_for(self._wake.wait(), hold)
            return
        admit = self._pick_admissions()
        if admit:
            self.admissions += 1
        if not self.running and not admit:
            self._wake.clear()
            await self._wake.wait()
            return
        for job in admit:
            job.slot = len(self.running)
            self.running.append(job)
        n = len(self.running)
        self.max_running_batch = max(self.max_running_batch, n)
        vector_slots = [j.slot for j in self.running if j.want_vectors]
        max_length = max((j.length if j not in admit else len(j.prompt.input_ids)) for j in self.running) + 1
        # The first step queued ahead comes from a step with nothing admitted or moved (the rows'
        # lengths and counts are known here only once their admission is dispatched).
        ahead = not moves and not admit and self._may_queue_ahead()
        try:
            step, pending = await self.thread.run(
                self._iterate, loop, moves, admit, n, vector_slots, max_length, ahead
            )
        except Exception as exc:
            self._fail(exc)
            return
        if pending is not None:
            self._pending = pending
            self.steps_ahead += 1
        self.steps += 1
        self.rows_stepped += n
        self._dispatch_step(step)

    def _may_queue_ahead(self) -> bool:
        return self.ahead and queue_ahead(
            lengths=[j.length for j in self.running],
            left=[j.max_tokens - j.generated for j in self.running],
            max_len=self.max_len,
            ended=any(j.finish is not None for j in self.running),
            admissions_due=bool(self.waiting) and len(self.running) < self.max_batch,
            held=not self._resume.is_set(),
            feeds_talker=any(j.want_vectors for j in self.running),
        )

    async def _next_pending(self) -> None:
        """With a step in flight: queue the next one and read this one's tokens, or (the batch
        changes, a hold is asked for) read its tokens only, so the next iteration starts clean."""
        pending, n = self._pending, len(self.running)
        self._pending = None
        vector_slots = [j.slot for j in self.running if j.want_vectors]
        # The rows' lengths count the step just read, not the one in flight: the next one's view.
        length = max(j.length for j in self.running) + 2 if self._may_queue_ahead() else 0
        try:
            step, queued = await self.thread.run(self._collect, pending, n, vector_slots, length)
        except Exception as exc:
            self._fail(exc)
            return
        if queued is not None:
            self._pending = queued
            self.steps_ahead += 1
        self.steps += 1
        self.rows_stepped += n
        self._dispatch_step(step)

    def _fail(self, exc: Exception) -> None:
        log.exception("thinker step failed; failing the running batch", exc_info=exc)
        for job in list(self.running):
            self._end(job, "error", error=f"thinker failed: {exc}")
        self.running.clear()
        self._pending = None

    def _drop_finished(self, ended: set[int]) -> list[tuple[int, int, int]]:
        slots: list[int | None] = [None if id(j) in ended else id(j) for j in self.running]
        if all(s is not None for s in slots):
            return []
        by_id = {id(j): j for j in self.running}
        moves, table = plan_compaction(slots, set())
        self.running = [by_id[row] for row in table if row is not None]
        result = []
        for src, dst in moves:
            job = by_id[slots[src]]  # type: ignore[index]
            job.slot = dst
            result.append((src, dst, job.length))
        return result

    def _gather_hold(self) -> float:
        if self.gather_s <= 0 or not self.waiting:  # off, or nothing to hold
            return 0.0
        since = self._submitted.get(id(self.waiting[0]))
        return gather_wait(
            running=len(self.running),
            waiting=len(self.waiting),
            incoming=self.incoming(),
            free=self.max_batch - len(self.running),
            waited_s=0.0 if since is None else time.monotonic() - since,
            gather_s=self.gather_s,
        )

    def _pick_admissions(self) -> list[ThinkerJob]:
        admit: list[ThinkerJob] = []
        free = self.max_batch - len(self.running)
        longest = 0
        while self.waiting and len(admit) < free:
            job = self.waiting[0]
            if job.kept is None:
                self._take_kept(job)
            length = len(job.prompt.input_ids) - job.kept_length  # what the prefill computes
            padded = max(longest, length) * (len(admit) + 1)
            if admit and padded > self.prefill_token_budget:
                break
            self.waiting.popleft()
            longest = max(longest, length)
            admit.append(job)
        self._admitted(admit)
        return admit

    # -- conversation KV --------------------------------------------------------------------------
    def _keeps(self, job: ThinkerJob) -> bool:
        """Whether a row that ended leaves its KV for its session's next turn."""
        return job.session is not None and self.kv.enabled and job.finish != "error" and job.length > 0

    def _seeds(self, job: ThinkerJob) -> bool:
        """Whether a row that ended offers its prompt's KV as a shared prefix (not copied out when
        an entry kept since its admission covers it already: a burst's rows end together)."""
        if not (job.seed and self.kv.enabled and job.finish != "error"):
            return False
        prompt = job.prompt
        return job.length >= len(prompt.input_ids) and not self.kv.covered(
            prompt.input_ids, prompt.positions, vectors=job.want_vectors
        )

    def _take_kept(self, job: ThinkerJob) -> None:
        """Take the session's kept entry, else (with shared prefixes) the shared entry that covers
        most of the prompt, and note how much of this prompt it may cover."""
        if not self.kv.enabled:
            return
        if job.session is not None:
            entry = self.kv.take(job.session)
            if entry is not None and (entry.has_vectors or not job.want_vectors):
                length = reusable_length(
                    kept_ids=entry.ids,
                    kept_positions=entry.positions,
                    new_ids=job.prompt.input_ids,
                    new_positions=job.prompt.positions,
                )
                if length > 0:
                    job.kept, job.kept_length = entry, length
                    return
        if not self.shared_prefixes:
            return
        shared = self.kv.shared_prefix(job.prompt.input_ids, job.prompt.positions, vectors=job.want_vectors)
        if shared is not None:
            job.kept, job.kept_length = shared
            self.kv.shared_hits += 1
            self.kv.shared_tokens += shared[1]
        elif job.session is None:  # a session keeps its KV under its own key
            job.seed = True

    def _keep(self, jobs: list[ThinkerJob]) -> list[KeptPrefix | None]:
        """Thinker thread: copy each ended session row's KV out of its slot."""
        kept: list[KeptPrefix | None] = []
        for job in jobs:
            prompt = job.prompt
            size = len(prompt.input_ids)
            fed = job.sampled[: job.length - size]
            vectors = None
            if job.want_vectors and job.prompt_vectors is not None and len(job.fed_vectors) >= len(fed):
                vectors = [job.prompt_vectors, *job.fed_vectors[: len(fed)]]
            try:
                payload = self.runner.keep(  # type: ignore[attr-defined]
                    slot=job.slot, length=size + len(fed), prompt=prompt, vectors=vectors
                )
            except Exception:  # a copy that fails (out of memory) costs the next turn a prefill
                log.exception("keeping the KV of session %s failed", job.session)
                kept.append(None)
                continue
            kept.append(
                KeptPrefix(
                    ids=np.asarray([*prompt.input_ids, *fed], dtype=np.int64),
                    positions=np.concatenate(
                        [
                            positions_of(prompt.positions, size),
                            decode_positions(size, size + len(fed), prompt.rope_delta),
                        ],
                        axis=1,
                    ),
                    payload=payload,
                    nbytes=int(payload.nbytes),
                    has_vectors=vectors is not None,
                )
            )
        return kept

    def _iterate(
        self,
        loop: asyncio.AbstractEventLoop,
        moves,
        admit: list[ThinkerJob],
        n: int,
        vector_slots: list[int],
        max_length: int,
        ahead: bool = False,
    ) -> tuple[ThinkerStep, Any]:
        """Thinker thread: compaction moves, prefill, one decode step; with ``ahead`` the step
        after it queued too (returned pending, its tokens unread)."""
        for src, dst, length in moves:
            self.runner.move(src, dst, length)
        if admit:
            rows = [
                ThinkerAdmission(
                    j.slot,
                    j.prompt,
                    j.sampling,
                    j.want_vectors,
                    prefix=None if j.kept is None else j.kept.payload,
                    prefix_length=j.kept_length,
                )
                for j in admit
            ]
            firsts = self.runner.admit(rows)
            reused = [r.reused for r in rows]
            loop.call_soon_threadsafe(self._dispatch_admitted, admit, firsts, reused)
        if not ahead:
            return self.runner.step(n, vector_slots=vector_slots, max_length=max_length), None
        runner: Any = self.runner
        first = runner.launch(n, vector_slots=vector_slots, max_length=max_length)
        pending = runner.launch(n, vector_slots=vector_slots, max_length=max_length + 1)
        return first.get(), pending

    def _collect(self, pending: Any, n: int, vector_slots: list[int], length: int) -> tuple[ThinkerStep, Any]:
        """Thinker thread: with ``length`` the next decode step queued (view ``length``), then the
        step in flight's tokens read."""
        runner: Any = self.runner
        queued = runner.launch(n, vector_slots=vector_slots, max_length=length) if length else None
        return pending.get(), queued

    # -- results (event loop) ---------------------------------------------------------------------
    def _dispatch_admitted(
        self, admit: list[ThinkerJob], firsts: list[tuple[int, Any]], reused: list[int]
    ) -> None:
        for job, (token, vectors), taken in zip(admit, firsts, reused, strict=True):
            job.length = len(job.prompt.input_ids)
            job.prompt_vectors = vectors
            job.kept, job.reused = None, taken  # the kept copy is in the slot now: free it
            if job.session is not None and self.kv.enabled:
                self.kv.note_admission(reused=taken, prompt_tokens=job.length)
                job.sampled.append(token)
            if job.finish is not None:
                continue
            if vectors is not None:
                job.events.put_nowait(("prompt_vectors", vectors))
            self._accept(job, token, None)

    def _dispatch_step(self, step: ThinkerStep) -> None:
        for job in self.running:
            token = step.tokens[job.slot]
            job.length += 1
            if job.session is not None and self.kv.enabled:  # what the cache holds, for _keep
                job.sampled.append(token)
                if job.want_vectors:
                    job.fed_vectors.append(step.vectors.get(job.slot))
            if job.finish is not None:
                continue  # ended during this step (stop string, cancel, or EOS at admission)
            self._accept(job, token, step.vectors.get(job.slot))

    def _accept(self, job: ThinkerJob, token: int, vector: Any) -> None:
        job.generated += 1
        job.events.put_nowait(ThinkerToken(token, vector))
        if token in self.eos and not job.ignore_eos:
            self._end(job, "stop")
        elif job.generated >= job.max_tokens or job.length >= self.max_len:
            self._end(job, "length")

    def _end(self, job: ThinkerJob, reason: FinishReason, *, error: str | None = None) -> None:
        if job.finish is None:
            job.finish = reason
            job.events.put_nowait(ThinkerDone(reason, error))
