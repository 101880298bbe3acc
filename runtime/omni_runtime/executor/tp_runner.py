"""Rank 0's thinker runner under tensor parallelism: every decoder op is announced to the followers.

The runner (runners.QwenThinkerRunner) is unchanged: it drives ``runner.decoder`` (a SlotDecoder
over this rank's shard of the layers) and samples. ``LeaderDecoder`` stands in for that decoder
and, before each op, sends the op to the followers (tp_group.TPLeader) so they replay it on their
shards in the same order:

- ``prefill``: slots and lengths in the header, then the prompt embeddings and mrope positions
  by broadcast (they hold media features only rank 0 computed), and a family's features added
  after decoder layers (Qwen3-Omni's DeepStack: the hook's ``deepstack`` (index [2, n], features
  [n, k, H]), their sizes in the header) which the followers add with the same
  ``slot_cache.add_after_layers``;
- ``decode``: n and max_length in the header, then rank 0's row state (``last_ids``, ``lengths``,
  ``rope_delta`` of rows 0..n-1) by broadcast: the tokens rank 0 sampled reach the followers
  just before the step that feeds them, whatever the runner did to its state in between;
- ``move`` (compaction) and ``capture_all`` (warm-up: every rank captures the same CUDA graph
  buckets in the same order, so the all-reduces inside the graphs pair up);
- conversation KV: ``keep_kv`` (each rank copies its shard of a slot out, under a handle),
  ``restore_kv`` (back into a slot, by handle) and a prefill after kept prefixes (``offsets`` in
  the prefill header). A follower's copy is forgotten when rank 0's copy is freed: the copy's
  finalizer queues the handle, and the next op sends the forgets first (ops go out only from the
  thinker thread, in order).

Only rank 0 samples. Hook contract with the runner: all decoder work goes through these four
SlotDecoder methods; state the runner writes directly (``last_ids`` etc.) is read back here.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch

from omni_runtime.contract.adapter import ThinkerAdmission, ThinkerStep
from omni_runtime.executor.tp_group import (
    OP_CAPTURE,
    OP_DECODE,
    OP_FORGET,
    OP_KEEP,
    OP_MOVE,
    OP_PREFILL,
    OP_RESTORE,
    TPLeader,
)


class LeaderDecoder:
    """A SlotDecoder proxy on rank 0 (attribute reads fall through to the real decoder)."""

    def __init__(self, inner: Any, leader: TPLeader) -> None:
        self._inner = inner
        self._leader = leader
        # Every rank runs each prefill unpadded: no rank captures a graph of collectives alone.
        inner.unpadded_prefills()
        self._handles = itertools.count(1)
        self._kept: dict[int, int] = {}  # id(rank 0's copy) -> handle of every rank's copy
        self._forgotten: list[int] = []  # handles whose rank-0 copy was freed (any thread appends)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _send(self, *values: int) -> None:
        while self._forgotten:
            self._leader.send(OP_FORGET, self._forgotten.pop())
        self._leader.send(*values)

    def prefill(
        self,
        *,
        slots: list[int],
        embeds: torch.Tensor,
        positions: torch.Tensor,
        lengths: list[int],
        want_hidden: bool,
        offsets: list[int] | None = None,
        after_layer: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        inner = self._inner
        embeds = embeds.to(inner.device, inner.dtype).contiguous()
        positions = positions.to(inner.device, torch.int64).contiguous()
        rows, width = embeds.shape[0], embeds.shape[1]
        deep = getattr(after_layer, "deepstack", None)
        features = 0 if deep is None else int(deep[1].shape[0])
        depth = 0 if deep is None else int(deep[1].shape[1])
        self._send(OP_PREFILL, rows, width, *slots, *lengths, *(offsets or [0] * rows), features, depth)
        self._leader.broadcast(embeds)
        self._leader.broadcast(positions)
        if deep is not None:
            self._leader.broadcast(deep[0].contiguous())
            self._leader.broadcast(deep[1].contiguous())
        return inner.prefill(  # type: ignore[no-any-return]
            slots=slots,
            embeds=embeds,
            positions=positions,
            lengths=lengths,
            want_hidden=want_hidden,
            offsets=offsets,
            after_layer=after_layer,
        )

    def keep_kv(self, slot: int, length: int) -> torch.Tensor:
        handle = next(self._handles)
        self._send(OP_KEEP, handle, slot, length)
        kv: torch.Tensor = self._inner.keep_kv(slot, length)
        key = id(kv)
        self._kept[key] = handle
        weakref.finalize(kv, self._forget, key, handle)
        return kv

    def _forget(self, key: int, handle: int) -> None:
        self._kept.pop(key, None)
        self._forgotten.append(handle)

    def restore_kv(self, kv: torch.Tensor, slot: int, length: int) -> None:
        self._send(OP_RESTORE, self._kept[id(kv)], slot, length)
        self._inner.restore_kv(kv, slot, length)

    def decode(self, n: int, *, max_length: int) -> Any:
        inner = self._inner
        # Everything a follower will receive exists before the header goes out: a failure after
        # the header would leave the followers waiting in a broadcast that never comes.
        state = torch.cat([inner.last_ids[:n], inner.lengths[:n], inner.rope_delta[:n]])
        self._send(OP_DECODE, n, max_length)
        self._leader.broadcast(state)
        return inner.decode(n, max_length=max_length)

    def move(self, src: int, dst: int, length: int) -> None:
        self._send(OP_MOVE, src, dst, length)
        self._inner.move(src, dst, length)

    def capture_all(self, *, max_view: int | None = None, progress: Any = None) -> int:
        self._send(OP_CAPTURE, -1 if max_view is None else max_view)
        return int(self._inner.capture_all(max_view=max_view, progress=progress))


class TPThinkerRunner:
    """The ThinkerRunner the scheduler sees on rank 0: the plain runner plus ``close``."""

    keeps_kv = True  # conversation KV: every rank keeps its shard (LeaderDecoder.keep_kv)

    def __init__(self, runner: Any, leader: TPLeader) -> None:
        self.runner = runner
        self.leader = leader
        runner.decoder = LeaderDecoder(runner.decoder, leader)
        self.slots: int = runner.slots
        self.max_len: int = runner.max_len

    def __getattr__(self, name: str) -> Any:  # decoder, embed, device, sampler (benchmarks read them)
        return getattr(self.runner, name)

    def admit(self, rows: list[ThinkerAdmission]) -> list[tuple[int, Any]]:
        return self.runner.admit(rows)  # type: ignore[no-any-return]

    def step(self, n: int, *, vector_slots: list[int], max_length: int) -> ThinkerStep:
        return self.runner.step(n, vector_slots=vector_slots, max_length=max_length)  # type: ignore[no-any-return]

    def move(self, src: int, dst: int, length: int) -> None:
        self.runner.move(src, dst, length)

    def warmup(self) -> None:
        self.runner.warmup()

    def close(self) -> None:
        """Stop the followers; call on the thinker thread after the scheduler stopped."""
        self.leader.close()
