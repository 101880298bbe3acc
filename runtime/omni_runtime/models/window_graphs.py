"""A vocoder's windows as CUDA graphs: one per input shape, replayed for every later window of it.

A vocoder window is thousands of small kernels (Qwen2.5's DiT ODE and BigVGAN; Qwen3's Code2Wav
transformer and convolutions). Launched one by one from Python they cost more CPU than GPU time,
hold the GIL the thinker's and talker's threads need, and queue behind each other's launches
under load. A captured graph launches them all at once. Both families batch windows of one size
from different streams (padded up to a bucket in ``BATCH_BUCKETS``, so a few shapes cover every
batch) and capture the shapes that recur (the segmenter's ``reusable`` windows) at start-up.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from omni_runtime.contract import switches
from omni_runtime.contract.adapter import window_shape
from omni_runtime.contract.engine import EngineError

log = logging.getLogger(__name__)

EAGER_LOG_S = 0.05  # an eager call that takes longer to launch than this is logged
# A batch of windows is padded up to one of these: few graph shapes.
BATCH_BUCKETS = switches.VOCODER_BATCH_BUCKETS
# Graphs kept captured per vocoder: every recurring window size at every bucket, with room.
MAX_GRAPHS = 64


def batch_bucket(n: int, buckets: tuple[int, ...] = BATCH_BUCKETS) -> int:
    """The smallest bucket that holds ``n`` windows (``n`` itself past the largest)."""
    return next((b for b in buckets if b >= n), n)


def vocoder_buckets(setting: str | None) -> tuple[int, ...]:
    """``OMNI_VOCODER_BUCKETS``'s value (comma-separated batch sizes, e.g. ``"1,2,4,6,8,12,16"``)
    as the buckets a vocoder pads its batches to; unset or empty: ``BATCH_BUCKETS``. A wrong value
    raises ValueError in the switch's words (contract.switches).

    A batch is padded up to its bucket, and every padded row costs a row's compute: 9 windows in
    the 16 bucket cost 16. Finer buckets waste less and capture more graphs at start-up (one per
    recurring window size and bucket; ``MAX_GRAPHS`` bounds them)."""
    return switches.parse("OMNI_VOCODER_BUCKETS", setting) or BATCH_BUCKETS


def configured_buckets() -> tuple[int, ...]:
    """The buckets ``OMNI_VOCODER_BUCKETS`` sets (``vocoder_buckets``); a wrong value stops the
    engine's start with a message naming the variable and its format."""
    try:
        return vocoder_buckets(os.environ.get("OMNI_VOCODER_BUCKETS"))
    except ValueError as exc:
        raise EngineError(str(exc), param="OMNI_VOCODER_BUCKETS") from None


def window_batches(items: list[dict[str, Any]], max_batch: int) -> Iterator[tuple[bool, list[int]]]:
    """Which of a vocoder call's windows run together: (reusable, item indices) per batch.

    Windows of one context size (and one ``reusable`` flag: graph or eager) share a batch of at
    most ``max_batch``, smallest size first: a stream's first window is the smallest, and it is
    the one a listener is waiting on. Empty windows run in none.
    """
    groups: dict[tuple[int, bool], list[int]] = {}
    for i, item in enumerate(items):
        w = item["window"]
        if w["end"] > w["start"]:
            groups.setdefault(window_shape(item), []).append(i)
    for (_, reusable), members in sorted(groups.items()):
        for first in range(0, len(members), max_batch):
            yield reusable, members[first : first + max_batch]


class WindowGraphs:
    """``fn(**inputs) -> Tensor`` as one CUDA graph per set of input shapes, captured on first use.

    ``fn`` must make no host syncs. Inputs are copied into the graph's own buffers and the output
    is the graph's buffer, valid until the next replay of any graph of this object (they share one
    memory pool: read it, or copy it, first). A capture that fails is logged once and turns graphs
    off: from then on every call runs eagerly, so a capture problem never loses audio.
    """

    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        *,
        device: torch.device,
        enabled: bool,
        limit: int,
        warm_once: bool = False,
        buckets: tuple[int, ...] = BATCH_BUCKETS,
    ) -> None:
        self.fn = fn
        self.buckets = buckets  # batch sizes a caller pads to (``bucket``): one graph shape each
        # Run ``fn`` outside a capture before the first capture only, not before each one: for an
        # ``fn`` whose compiled parts take any shape (compiled and initialised by the first run).
        self.warm_once = warm_once
        self._warmed = False
        self.device = device
        self.enabled = enabled and device.type == "cuda"
        self.limit = limit
        self.eager_calls = 0  # calls run without a graph (one-off shapes, or graphs off)
        # shapes -> (graph, its input buffers, its output buffer)
        self._graphs: dict[
            tuple[Any, ...], tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor], torch.Tensor]
        ] = {}
        self._pool: Any = None

    def bucket(self, n: int) -> int:
        """The batch ``n`` windows are padded to: the smallest of ``buckets`` that holds them."""
        return batch_bucket(n, self.buckets)

    def __len__(self) -> int:
        return len(self._graphs)

    def clear(self) -> None:
        """Drop every graph; with ``warm_once``, the next capture warms ``fn`` first again (what it
        runs may have changed, and a compile must not happen inside a capture)."""
        self._graphs.clear()
        self._warmed = False

    def run(
        self,
        inputs: dict[str, torch.Tensor],
        *,
        use_graph: bool = True,
        eager: Callable[..., torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``fn(**inputs)``: through the graph of these shapes when ``use_graph`` (captured now if
        missing), else eagerly through ``eager`` (default ``fn``)."""
        if not (self.enabled and use_graph):
            return self._eager(inputs, eager)
        key = tuple((name, tuple(value.shape)) for name, value in inputs.items())
        entry = self._graphs.get(key)
        if entry is None:
            try:
                entry = self._capture(inputs)
            except RuntimeError as exc:
                log.warning("vocoder CUDA graph capture failed (%s); running eagerly", exc)
                self.enabled = False
                return self._eager(inputs, eager)
            if len(self._graphs) >= self.limit:
                self._graphs.pop(next(iter(self._graphs)))
            self._graphs[key] = entry
        graph, buffers, out = entry
        for name, value in inputs.items():
            buffers[name].copy_(value)
        graph.replay()
        return out

    def _eager(
        self, inputs: dict[str, torch.Tensor], eager: Callable[..., torch.Tensor] | None
    ) -> torch.Tensor:
        """One call without a graph. Its kernels are launched one by one from Python, holding the
        GIL and the vocoder thread the whole time: one that takes long is logged with its shapes."""
        self.eager_calls += 1
        began = time.perf_counter()
        out = (eager or self.fn)(**inputs)
        took = time.perf_counter() - began
        if took > EAGER_LOG_S and self.device.type == "cuda":  # on the CPU every call is eager
            shapes = ", ".join(f"{name} {tuple(value.shape)}" for name, value in inputs.items())
            log.info("a window without a captured graph took %.0f ms to launch (%s)", took * 1000, shapes)
        return out

    def _capture(
        self, inputs: dict[str, torch.Tensor]
    ) -> tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor], torch.Tensor]:
        buffers = {name: value.clone() for name, value in inputs.items()}
        # Same priority as the replaying stream: a graph's kernels keep their capture stream's.
        current = torch.cuda.current_stream(self.device)
        stream = torch.cuda.Stream(device=self.device, priority=current.priority)
        stream.wait_stream(current)
        if not (self.warm_once and self._warmed):
            with torch.cuda.stream(stream):
                self.fn(**buffers)  # warm-up outside the capture (lazy initialisation, autotuning)
            current.wait_stream(stream)
            self._warmed = True
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"):
            out = self.fn(**buffers)
        return graph, buffers, out
