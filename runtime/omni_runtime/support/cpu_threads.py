"""How many CPU threads torch may use in a worker or stage process.

torch sizes its OpenMP pool to every core of the host. On a GPU worker the model's math runs on the
GPU, yet the CPU-side tensor ops around it (chat preprocessing, position ids, sampling bookkeeping)
still open parallel regions, and after each one the pool's threads spin waiting for the next. On
a 16-core H100 host that kept 7 to 10 cores busy for a worker serving 8-token replies (115 ms of CPU
per request against 11 ms with one thread), slowed the worker itself (146 → 244 requests/s at 16
clients with one thread) and took the cores the router and the clients on the same host needed.
In a pod, the pool is also sized by the node's cores, not the pod's CPU limit, so it is throttled.

So a process whose stages run on a GPU gets one intra-op thread, as the field's GPU servers do,
unless `--cpu-threads` or OMP_NUM_THREADS says otherwise. On the CPU the pool does the model's
math and keeps torch's own size.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

log = logging.getLogger("omni.runtime")

GPU_THREADS = 1


@dataclass(frozen=True)
class ThreadChoice:
    threads: int | None  # None: leave torch's own choice (all cores, or OMP_NUM_THREADS)
    reason: str


def choose_threads(
    *, device: str, requested: int | None, env: Mapping[str, str], gpu_available: bool
) -> ThreadChoice:
    """The intra-op thread count for a process serving on `device` (auto, cpu or cuda)."""
    if requested is not None:
        return ThreadChoice(requested, "--cpu-threads")
    if env.get("OMP_NUM_THREADS", "").strip():
        return ThreadChoice(None, "OMP_NUM_THREADS is set")
    on_gpu = device == "cuda" or (device == "auto" and gpu_available)
    if on_gpu:
        return ThreadChoice(GPU_THREADS, "the stages run on a GPU")
    return ThreadChoice(None, "the stages run on the CPU")


def apply_cpu_threads(
    *, device: str, requested: int | None, environ: MutableMapping[str, str] | None = None
) -> ThreadChoice:
    """Choose and set the count in torch, and in the environment for the processes this one starts
    (TP ranks, stage processes), which read OMP_NUM_THREADS when torch starts its pool."""
    import torch

    environ = os.environ if environ is None else environ
    choice = choose_threads(
        device=device, requested=requested, env=environ, gpu_available=torch.cuda.is_available()
    )
    if choice.threads is not None:
        torch.set_num_threads(choice.threads)
        environ["OMP_NUM_THREADS"] = str(choice.threads)
    log.info("torch CPU threads: %d (%s)", torch.get_num_threads(), choice.reason)
    return choice
