"""A tensor-parallel follower: rank 1..N-1 of the group, spawned by rank 0 (the worker).

``python -m omni_runtime.entrypoints.tp_follower --rank R --world N --init-method tcp://... --options JSON``

With ``--role image_encoder`` it is a rank of the vision tower's group instead (spawned by the
image-encoder stage process, see vision_tp): it loads and shards the tower and replays each
forward rank 0 announces. What follows describes the thinker role.

It loads the thinker text model exactly as rank 0 does (same checkpoint, or the same seed for
dummy weights, so replicated parts match), keeps its shard of every decoder layer, joins the
process group, then replays the ops rank 0 announces on its stdin (see tp_group / tp_runner)
until STOP or EOF. It never samples: its logits are discarded. Any error exits non-zero; rank 0's
watchdog then stops the worker with a clear message.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("omni.tp_follower")


def _fit(adapter: Any, *, slots: int, max_len: int) -> int:
    """This rank's KV-cache slot budget; 0 when not even one request fits (rank 0 reports it)."""
    from omni_runtime.contract.engine import EngineError
    from omni_runtime.models.common import thinker_slots

    try:
        return thinker_slots(adapter, slots=slots, max_len=max_len)
    except EngineError as exc:
        log.error("%s", exc)
        return 0


def serve_ops(adapter: Any, leader_fd: int) -> int:
    """Replay rank 0's decoder ops until STOP or EOF; returns the exit code."""
    import torch
    import torch.distributed as dist

    from omni_runtime.executor.slot_cache import add_after_layers
    from omni_runtime.executor.tp_group import (
        OP_BUILD,
        OP_CAPTURE,
        OP_DECODE,
        OP_FORGET,
        OP_KEEP,
        OP_MOVE,
        OP_PREFILL,
        OP_RESTORE,
        OP_STOP,
        read_message,
    )
    from omni_runtime.support.gc_pauses import freeze_heap

    device = adapter.placement.thinker
    decoder: Any = None
    kept: dict[int, Any] = {}  # conversation KV: this rank's shard of each copy rank 0 keeps
    hidden = int(adapter.loaded.config.thinker_config.text_config.hidden_size)
    while True:
        message = read_message(leader_fd)
        if message is None:
            log.info("the worker closed the op pipe; exiting")
            return 0
        op, args = message[0], message[1:]
        with torch.inference_mode():
            if op == OP_DECODE:
                n, max_length = args[0], args[1]
                state = torch.empty(3 * n, dtype=torch.int64, device=device)
                dist.broadcast(state, src=0)
                decoder.last_ids[:n].copy_(state[:n])
                decoder.lengths[:n].copy_(state[n : 2 * n])
                decoder.rope_delta[:n].copy_(state[2 * n :])
                decoder.decode(n, max_length=max_length)
            elif op == OP_PREFILL:
                rows, width = args[0], args[1]
                slots, lengths = args[2 : 2 + rows], args[2 + rows : 2 + 2 * rows]
                offsets = list(args[2 + 2 * rows : 2 + 3 * rows])
                features, depth = args[2 + 3 * rows : 4 + 3 * rows]
                embeds = torch.empty(rows, width, hidden, dtype=decoder.dtype, device=device)
                positions = torch.empty(3, rows, width, dtype=torch.int64, device=device)
                dist.broadcast(embeds, src=0)
                dist.broadcast(positions, src=0)
                after_layer = None
                if features:  # a family's features added after decoder layers (Qwen3's DeepStack)
                    index = torch.empty(2, features, dtype=torch.int64, device=device)
                    stacked = torch.empty(features, depth, hidden, dtype=decoder.dtype, device=device)
                    dist.broadcast(index, src=0)
                    dist.broadcast(stacked, src=0)
                    after_layer = add_after_layers(index, stacked)
                decoder.prefill(
                    slots=slots,
                    embeds=embeds,
                    positions=positions,
                    lengths=lengths,
                    want_hidden=False,
                    offsets=offsets if any(offsets) else None,
                    after_layer=after_layer,
                )
            elif op == OP_MOVE:
                decoder.move(args[0], args[1], args[2])
            elif op == OP_KEEP:
                kept[args[0]] = decoder.keep_kv(args[1], args[2])
            elif op == OP_RESTORE:
                decoder.restore_kv(kept[args[0]], args[1], args[2])
            elif op == OP_FORGET:
                kept.pop(args[0], None)
            elif op == OP_CAPTURE:
                decoder.capture_all(max_view=None if args[0] < 0 else args[0])
                # Warm-up is over (compiled and captured): a full collection in any rank would stall
                # every rank's step at the next all-reduce, so freeze what is alive now.
                freeze_heap(f"thinker TP rank {dist.get_rank()}")
            elif op == OP_BUILD:
                value = torch.tensor([_fit(adapter, slots=args[0], max_len=args[1])], device=device)
                dist.all_reduce(value, op=dist.ReduceOp.MIN)
                agreed = int(value.item())
                if agreed < 1:
                    continue  # rank 0 reports the error and stops us
                decoder = adapter.build_thinker_runner(slots=agreed, max_len=args[1]).decoder
                decoder.unpadded_prefills()  # as rank 0's (LeaderDecoder)
            elif op == OP_STOP:
                log.info("stopping")
                return 0
            else:
                log.error("unknown op %d from rank 0", op)
                return 3


def _watch_parent(parent: int) -> None:
    """Exit when the worker is gone, even while the main thread waits in a collective that the
    dead worker will never join (pipe EOF is only seen between ops)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    log.error("rank 0 (pid %d) is gone; exiting", parent)
    logging.shutdown()
    os._exit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m omni_runtime.entrypoints.tp_follower")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--init-method", required=True)
    parser.add_argument("--model-path", default="")
    parser.add_argument("--options", required=True, help="EngineOptions as JSON")
    parser.add_argument("--role", choices=["thinker", "image_encoder"], default="thinker")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s tp-rank{args.rank} %(name)s: %(message)s",
    )
    # The op pipe is our stdin; keep it away from anything else that might read stdin.
    leader_fd = os.dup(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    # Our life is the worker's: a terminal's Ctrl-C or a process-group SIGTERM reaches the worker
    # too, which then stops us with STOP/EOF; dying first would look like a crash to its watchdog.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), name="parent-watch", daemon=True).start()

    from omni_runtime.executor.tp_group import end_process_if_nccl, init_group, options_from_json
    from omni_runtime.models.registry import load_adapter

    options = options_from_json(args.options)
    path = Path(args.model_path) if args.model_path else None
    hosted = frozenset({args.role})
    try:
        if args.role == "image_encoder":  # the vision tower's group: Qwen2.5-Omni's tower
            from omni_runtime.models.qwen2_5_omni.loader import load_model
            from omni_runtime.models.qwen2_5_omni.vision_tp import serve_vision_ops

            loaded = load_model(options, path=path, hosted=hosted, tp_rank=args.rank)
            device = loaded.placement.vision
            init_group(rank=args.rank, world=args.world, init_method=args.init_method, device=device)
            code = serve_vision_ops(loaded.visual, device, leader_fd)
        else:  # the thinker's group, of the checkpoint's family
            adapter: Any = load_adapter(options, hosted=hosted, path=path, tp_rank=args.rank)
            init_group(
                rank=args.rank,
                world=args.world,
                init_method=args.init_method,
                device=adapter.placement.thinker,
            )
            code = serve_ops(adapter, leader_fd)
    except Exception:
        log.exception("%s TP rank %d failed", args.role.replace("_", "-"), args.rank)
        return 1
    import torch.distributed as dist

    if dist.is_initialized():
        end_process_if_nccl(code)  # NCCL: leave without the communicator teardown
        dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
