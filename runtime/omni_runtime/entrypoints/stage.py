"""`omni stage`: some stages of a worker's pipeline as their own process, behind a stage link.

The planner runs, for example, the encoders, mm_aggregate and the thinker in one GPU pod and the
talker in another; each is ``omni stage --stages ... --port N`` with the same model and placement
flags as ``omni serve``. The process listens at once (so the worker's engine can connect and see
"not ready"), loads only the modules of its stages, warms them up, then reports ready through
the link's health method. The stage code is the same as in-process: LocalStages plus handlers.

SIGTERM (and Ctrl-C) stop it cleanly: the link closes and TP followers are stopped before exit 0.
A worker that starts its image encoder as a stage of its own (image-encoder TP, see
models/vision_stage.py) runs ``python -m omni_runtime.entrypoints.stage ... --parent-pid PID``: the stage then
exits when that parent is gone.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

from omni_runtime.contract import switches
from omni_runtime.contract.options import EngineOptions
from omni_runtime.contract.stages import HOSTABLE, Stage, with_colocated

log = logging.getLogger("omni.stage")


def _stages(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [n for n in names if n not in HOSTABLE]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown stage(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(HOSTABLE)}"
        )
    return names


def build_parser() -> argparse.ArgumentParser:
    """The `omni serve` flags (model, placement, identity) plus --stages."""
    from omni_runtime.entrypoints.serve import build_parser as serve_parser

    parser = serve_parser()
    parser.prog = "omni stage"
    parser.description = "Serve some pipeline stages over a stage link (binary transport for tensors)."
    parser.add_argument(
        "--stages",
        type=_stages,
        required=True,
        help="comma list of stages to host, e.g. audio_encoder,image_encoder,mm_aggregate,thinker",
    )
    # Set by a worker that starts this stage itself: exit when that process is gone.
    parser.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    return parser


@dataclass
class StageProcess:
    server: object
    local: object
    address: str

    async def close(self) -> None:
        await self.server.close()  # type: ignore[attr-defined]
        await self.local.stop()  # type: ignore[attr-defined]


def hosted_stages(stages: tuple[str, ...]) -> frozenset[str]:
    return with_colocated({Stage(s) for s in stages})  # the vocoder runs where the talker runs


async def start_stage_process(
    options: EngineOptions, stages: tuple[str, ...], *, host: str, port: int, freeze_gc: bool = False
) -> StageProcess:
    """Listen, load, warm up, then report ready. Returns once ready."""
    from omni_runtime.models.registry import load_adapter
    from omni_runtime.pipeline.link.server import StageLinkServer
    from omni_runtime.pipeline.services import LocalStages
    from omni_runtime.pipeline.stage_server import StageHandlers
    from omni_runtime.support.gc_pauses import freeze_heap

    hosted = hosted_stages(stages)
    server = StageLinkServer({}, ready=False)
    address = await server.start(host, port)
    log.info("stage link listening on %s for %s (loading)", address, ",".join(sorted(hosted)))
    adapter = await asyncio.to_thread(load_adapter, options, hosted=hosted)
    local = LocalStages(adapter, options, hosted=hosted)
    await local.start()
    await local.warmup()
    if freeze_gc:
        freeze_heap(f"omni stage {','.join(sorted(hosted))}")  # as omni serve: after warm-up
    server.handlers.update(StageHandlers(local).handlers())
    server.ready = True
    log.info("stages %s ready on %s", ",".join(sorted(hosted)), address)
    return StageProcess(server=server, local=local, address=address)


async def _serve(options: EngineOptions, stages: tuple[str, ...], host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    process = await start_stage_process(options, stages, host=host, port=port, freeze_gc=True)
    print(f"omni stage: serving {','.join(stages)} on {process.address}", file=sys.stderr, flush=True)
    try:
        await stop.wait()
        log.info("stopping")
    finally:
        await process.close()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    log.error("the process that started this stage (pid %d) is gone; exiting", parent)
    logging.shutdown()
    os._exit(1)


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if wrong := switches.problems(os.environ):  # before anything loads: a wrong switch is not the default
        print(f"omni stage: {'; '.join(wrong)}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from omni_runtime.entrypoints.serve import engine_options

    options = engine_options(args, remote_stages={})
    from omni_runtime.support.cpu_threads import apply_cpu_threads

    apply_cpu_threads(device=options.device, requested=args.cpu_threads)
    if args.parent_pid is not None:
        threading.Thread(
            target=_watch_parent, args=(args.parent_pid,), name="parent-watch", daemon=True
        ).start()
    from omni_runtime.contract.engine import EngineError

    try:
        asyncio.run(_serve(options, args.stages, args.host, args.port))
    except EngineError as exc:
        print(f"omni stage: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"omni stage: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    from omni_runtime.executor.tp_group import end_process_if_nccl

    end_process_if_nccl(0)  # an image-encoder or thinker TP group on GPUs: no NCCL teardown
    from omni_runtime.entrypoints.console import end_process

    end_process(0)  # stopped in order: skip the teardown of the frozen heap (entrypoints.console)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
