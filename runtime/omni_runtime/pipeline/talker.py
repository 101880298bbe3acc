"""The talker stage: continuously batched codec-token generation that follows the thinker.

Talker row k needs the thinker's reply vector k, so rows whose thinker has not produced it yet
are *held*: the batch still steps (static shapes), but a held row's output is discarded and its
length does not advance, so its next real step overwrites the scratch cache entry. Once the
thinker's text ends, a row is fed the text-EOS vector once and then text-PAD until it emits a
codec end token (or reaches its budget). Codes go back to the request's consumer, which cuts them
into vocoder windows (segmenter) and synthesises audio on the vocoder's own thread.

Conversation KV (``--session-kv-mb``): when a session's row ends, the talker KV of its prompt part
(the thinker prompt's positions, not the codes after them) is kept under the session key, and the
session's next turn restores the part of it that is exactly what a full prefill would compute and
prefills only the rest. The talker's prompt vectors come from the thinker, and for the positions
the thinker reused they are the kept vectors, bit for bit the ones this talker prefilled last
turn; so a talker row reuses at most the talker positions its thinker's reused positions cover
(``prefix_limit``, mapped by the runner: ``KeepingTalkerRunner.shared_length``), and at most what
the previous turn kept (``kept_length``: its prompt's shareable part; the reply after it was fed
as codes, not as prompt).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from omni_runtime.contract.adapter import KeepingTalkerRunner, TalkerAdmission, TalkerRunner
from omni_runtime.pipeline.conversation_kv import ConversationKV, KeptPrefix, common_length
from omni_runtime.pipeline.scheduler import FinishReason, plan_compaction
from omni_runtime.pipeline.workers import SchedulerLoop, StageThread

log = logging.getLogger(__name__)
FREE_RUN_STEPS = 4  # talker steps per thread call once every row free-runs (see _free_run_steps)


@dataclass(frozen=True)
class TalkerDone:
    reason: FinishReason
    error: str | None = None


@dataclass(eq=False)
class TalkerJob:
    admission: TalkerAdmission
    request_id: str = ""
    max_codes: int = 4096
    codes_per_text_token: int = 30  # budget once the text is known: runaway guard for random weights
    pending: deque[Any] = field(default_factory=deque)
    text_done: bool = False
    text_tokens: int = 0
    eos_fed: bool = False
    events: asyncio.Queue[list[Any] | TalkerDone] = field(default_factory=asyncio.Queue)
    slot: int = -1
    length: int = 0
    codes: int = 0
    finish: FinishReason | None = None
    session: str | None = None  # conversation KV: keep this row's prompt KV under this key
    prefix_limit: int = 0  # prompt positions its thinker served from kept KV (the most it may reuse)

    def limit(self) -> int:
        if not self.text_done or self.admission.ignore_eos:  # ignore_eos: exactly max_codes
            return self.max_codes
        return min(self.max_codes, 100 + self.codes_per_text_token * self.text_tokens)


class TalkerScheduler(SchedulerLoop[TalkerJob]):
    task_name = "talker-scheduler"

    def __init__(
        self,
        runner: TalkerRunner,
        *,
        thread: StageThread,
        max_batch: int,
        max_len: int,
        session_kv_bytes: int = 0,
    ) -> None:
        super().__init__()
        self.runner = runner
        # Conversation KV: only a runner that can copy a slot's KV out and back keeps any.
        self.kv = ConversationKV(session_kv_bytes if getattr(runner, "keeps_kv", False) else 0)
        self.thread = thread
        self.max_batch = min(max_batch, runner.slots)
        self.max_len = max_len
        self.eos = frozenset(runner.codec_eos_ids)
        self.running: list[TalkerJob] = []
        self.max_running_batch = 0
        self.rows_stepped = 0  # rows that advanced (held rows excluded): their mean is the useful batch
        self.cancelled = 0  # rows (running or waiting) finished by a cancel

    def feed(self, job: TalkerJob, vector: Any) -> None:
        job.pending.append(vector)
        self._wake.set()

    def text_finished(self, job: TalkerJob, text_tokens: int) -> None:
        job.text_done = True
        job.text_tokens = text_tokens
        self._wake.set()

    def finish(self, job: TalkerJob, reason: FinishReason) -> None:
        if job.finish is not None:
            return
        self._unqueue(job)
        if reason == "cancelled":
            self.cancelled += 1
            if job in self.running:  # a free run stops before its next step (_steps)
                self.thread.note_cancel()
        self._end(job, reason)
        self._wake.set()

    def end_session(self, session: str) -> None:
        """Forget a session's kept talker KV (closed); its rows still queued or running keep none."""
        self.kv.drop(session)
        for job in (*self.waiting, *self.running):
            if job.session == session:
                job.session = None

    @property
    def active(self) -> int:
        return len(self.waiting) + sum(j.finish is None for j in self.running)

    # -- conversation KV --------------------------------------------------------------------------
    @property
    def _keeping(self) -> KeepingTalkerRunner:
        return cast(KeepingTalkerRunner, self.runner)  # only called where self.kv is enabled

    def _keeps(self, job: TalkerJob) -> bool:
        """Whether a row that ended leaves its prompt's KV for its session's next turn."""
        if job.session is None or not self.kv.enabled or job.finish == "error":
            return False
        return job.length >= self._keeping.kept_length(job.admission) > 0

    def _keep(self, jobs: list[TalkerJob]) -> list[Any]:
        """Talker thread: copy each ended session row's prompt KV out of its slot."""
        kept: list[Any] = []
        for job in jobs:
            try:
                kept.append(
                    self._keeping.keep(slot=job.slot, length=self._keeping.kept_length(job.admission))
                )
            except Exception:  # a copy that fails (out of memory) costs the next turn a prefill
                log.exception("keeping the talker KV of session %s failed", job.session)
                kept.append(None)
        return kept

    def _take_kept(self, job: TalkerJob) -> None:
        """Give an admitted row the part of its session's kept KV it may reuse."""
        if job.session is None or not self.kv.enabled:
            return
        entry = self.kv.take(job.session)
        if entry is None:
            return
        ids = job.admission.input_ids
        shared = min(job.prefix_limit, common_length(entry.ids, ids))  # thinker positions as kept
        length = self._keeping.shared_length(job.admission, shared)
        self.kv.note_admission(reused=max(length, 0), prompt_tokens=self.runner.prompt_length(job.admission))
        if length > 0:
            job.admission = replace(job.admission, prefix=entry.payload, prefix_length=length)

    def _next_input(self, job: TalkerJob) -> Any:
        if job.pending:
            return job.pending.popleft()
        if not job.text_done:
            return None  # wait for the thinker
        if not job.eos_fed:
            job.eos_fed = True
            return self.runner.text_vector("eos")
        return self.runner.text_vector("pad")

    async def _iteration(self) -> None:
        ended = {id(j) for j in self.running if j.finish is not None}
        keep = [j for j in self.running if id(j) in ended and self._keeps(j)]
        if keep:  # before the compaction below moves other rows over their slots
            kept = await self.thread.run(self._keep, keep)
            for job, payload in zip(keep, kept, strict=True):
                if payload is not None and job.session is not None:
                    ids = np.asarray(job.admission.input_ids, dtype=np.int64)
                    entry = KeptPrefix(
                        ids=ids,
                        positions=np.zeros((3, 0), dtype=np.int64),  # the thinker's reuse checked them
                        payload=payload,
                        nbytes=int(payload.nbytes),
                        has_vectors=False,
                    )
                    self.kv.put(job.session, entry)
                job.session = None  # kept once
        # Only rows that had ended before the copy leave: one that ended during it is kept next time.
        slots: list[int | None] = [None if id(j) in ended else i for i, j in enumerate(self.running)]
        moves, table = plan_compaction(slots, set())
        old = self.running
        self.running = [old[i] for i in table if i is not None]
        move_plan = []
        for src, dst in moves:
            old[src].slot = dst
            move_plan.append((src, dst, old[src].length))
        admit: list[TalkerJob] = []
        while self.waiting and len(self.running) + len(admit) < self.max_batch:
            admit.append(self.waiting.popleft())
        self._admitted(admit)
        for job in admit:
            self._take_kept(job)
        inputs = [self._next_input(j) for j in self.running]
        if not admit and all(v is None for v in inputs):
            if move_plan:
                await self.thread.run(self._moves, move_plan)
            if any(j.finish is not None for j in self.running):
                return  # a row ended during the copy: the next iteration keeps it and lets it go
            self._wake.clear()
            await self._wake.wait()
            # Inputs taken above were None for every row: nothing was consumed.
            return
        for job in admit:
            job.slot = len(self.running) + admit.index(job)
        n_old = len(self.running)
        max_length = max([j.length + 1 for j in self.running] or [1])
        steps = self._free_run_steps(admit)
        if steps > 1:
            await self._free_run(move_plan, inputs, steps, max_length)
            return
        try:
            firsts, codes = await self.thread.run(self._iterate, move_plan, admit, n_old, inputs, max_length)
        except Exception as exc:
            log.exception("talker step failed; failing its batch")
            for job in [*self.running, *admit]:
                self._end(job, "error", error=f"talker failed: {exc}")
            self.running.clear()
            return
        self.rows_stepped += len(admit) + sum(code is not None for code in codes)
        for job, code in zip(self.running, codes, strict=True):
            if code is not None:
                job.length += 1
                self._accept(job, code)
        for job, (code, length) in zip(admit, firsts, strict=True):
            job.length = length
            self.running.append(job)
            self._accept(job, code)
        self.max_running_batch = max(self.max_running_batch, len(self.running))

    def _free_run_steps(self, admit: list[TalkerJob]) -> int:
        """Steps to run in one call of the talker thread: several once every row free-runs.

        A row free-runs once its text is known and fed (its input is text-PAD from then on), so
        nothing the event loop does can change the next steps' inputs. Running ``FREE_RUN_STEPS``
        of them per call saves the round trips through the event loop that otherwise pace the
        talker below 50 steps a second (real time) when the loop is busy with many streams.
        Never past the cache (``max_len``), and one step while anyone waits for a row.
        """
        if admit or self.waiting or not self.running:
            return 1
        if not all(j.text_done and j.eos_fed and not j.pending and j.finish is None for j in self.running):
            return 1
        room = min(self.max_len - 2 - j.length for j in self.running)
        return max(1, min(FREE_RUN_STEPS, room))

    async def _free_run(self, move_plan, inputs: list[Any], steps: int, max_length: int) -> None:
        n = len(self.running)
        try:
            rounds = await self.thread.run(
                self._steps, move_plan, list(self.running), inputs, steps, max_length
            )
        except Exception as exc:
            log.exception("talker step failed; failing its batch")
            for job in self.running:
                self._end(job, "error", error=f"talker failed: {exc}")
            self.running.clear()
            return
        for codes in rounds:
            self.rows_stepped += n
            for job, code in zip(self.running, codes, strict=True):
                job.length += 1
                self._accept(job, code)  # a row that ended mid-run ignores the codes after its end
        self.max_running_batch = max(self.max_running_batch, n)

    def _steps(
        self, move_plan, jobs: list[TalkerJob], inputs: list[Any], steps: int, max_length: int
    ) -> list[list[Any]]:
        """Talker thread: up to ``steps`` decode steps of free-running rows (text-PAD in every row).

        A row finished meanwhile on the event loop (a cancel) ends the run before the next step
        (or before the first, when the call waited for the thread), so a cancelled row takes part
        in no step begun after its cancel; the loop compacts it away.
        """
        self._moves(move_plan)
        n = len(jobs)
        pad = self.runner.text_vector("pad")
        rounds: list[list[Any]] = []
        for _ in range(steps):
            if any(j.finish is not None for j in jobs):
                break
            i = len(rounds)
            codes = self.runner.step(n, inputs=[pad] * n if i else inputs, max_length=max_length + i)
            rounds.append([c for c in codes if c is not None])
        return rounds

    def _moves(self, move_plan: list[tuple[int, int, int]]) -> None:
        for src, dst, length in move_plan:
            self.runner.move(src, dst, length)

    def _iterate(self, move_plan, admit: list[TalkerJob], n: int, inputs: list[Any], max_length: int):
        """Talker thread: compaction, one step for running rows, then prefill of new rows.

        The step is skipped when every row in it was finished meanwhile (a cancel): nothing
        would keep its codes. The loop compacts those rows away before the next step.
        """
        self._moves(move_plan)
        codes: list[Any] = []
        live = any(j.finish is None for j in self.running[:n])
        if n and live and any(v is not None for v in inputs):
            codes = self.runner.step(n, inputs=inputs, max_length=max_length)
        else:
            codes = [None] * n
        firsts: list[tuple[Any, int]] = []
        if admit:
            first_codes = self.runner.admit([self._admission(j) for j in admit])
            firsts = [
                (c, self.runner.prompt_length(j.admission)) for c, j in zip(first_codes, admit, strict=True)
            ]
        return firsts, codes

    def _admission(self, job: TalkerJob) -> TalkerAdmission:
        """The row as the runner admits it: in its slot, and with ignore_eos its end codes never
        sampled (so it ends at its budget, "length")."""
        admission = replace(job.admission, slot=job.slot)
        if not admission.ignore_eos:
            return admission
        suppress = (*admission.sampling.suppress_tokens, *sorted(self.eos))
        return replace(admission, sampling=replace(admission.sampling, suppress_tokens=suppress))

    def _accept(self, job: TalkerJob, code: Any) -> None:
        """One code of ``job``: a codec token, or a frame (a sequence led by its first codebook's)."""
        if job.finish is not None:
            return
        if (code[0] if isinstance(code, (tuple, list)) else code) in self.eos:
            self._end(job, "stop")
            return
        job.codes += 1
        job.events.put_nowait([code])
        if job.codes >= job.limit() or job.length + 1 >= self.max_len:
            self._end(job, "length")

    def _end(self, job: TalkerJob, reason: FinishReason, *, error: str | None = None) -> None:
        if job.finish is None:
            job.finish = reason
            job.events.put_nowait(TalkerDone(reason, error))
