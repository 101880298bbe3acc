"""A tensor-parallel group (the thinker's, or the image encoder's), seen from rank 0.

Rank 0 runs the scheduler, sampling and the API; ranks 1..N-1 are follower processes
(``omni_runtime.entrypoints.tp_follower``) that this module spawns, one per GPU of --thinker-gpus,
joined with rank 0 in one torch.distributed group (NCCL on CUDA, gloo on the CPU) through a
loopback TCP rendezvous. Followers replay every decoder op rank 0 runs, in the same order, so
the all-reduces inside the sharded layers (and inside captured CUDA graphs) pair up.

Op headers travel over each follower's stdin pipe (a few ints: no device sync, and a follower
idles in a blocking read rather than in a collective that would time out); tensors (prompt
embeddings, positions, the rows' decode state) travel by ``dist.broadcast`` right after. The
pipe also ties the followers' life to the worker: when the worker dies, the pipe closes and
they exit. A follower that dies first takes the worker down with a clear log line (exit 1),
because a thinker missing a shard cannot answer anything.

The image encoder's group (``role="image_encoder"``, --image-encoder-tp-size) uses the same
machinery from its own stage process (models/vision_tp.py): a process has one default group, and
a worker with thinker TP already uses its own for the thinker.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

import torch

from omni_runtime.contract.engine import EngineError
from omni_runtime.contract.options import EngineOptions

log = logging.getLogger(__name__)

OP_PREFILL, OP_DECODE, OP_MOVE, OP_CAPTURE, OP_BUILD, OP_STOP = 1, 2, 3, 4, 5, 6
OP_VISION = 7  # image-encoder group: one vision tower forward (models/vision_tp.py)
OP_KEEP, OP_RESTORE, OP_FORGET = 8, 9, 10  # conversation KV: each rank keeps its shard's copy
INIT_TIMEOUT = timedelta(minutes=30)  # ranks load their weights before they meet


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pack(values: list[int]) -> bytes:
    return struct.pack(f"<q{len(values)}q", len(values), *values)


def read_message(fd: int) -> list[int] | None:
    """One op message from a pipe; None at EOF (the worker is gone or stopped)."""
    head = _read_exact(fd, 8)
    if head is None:
        return None
    (count,) = struct.unpack("<q", head)
    body = _read_exact(fd, 8 * count)
    if body is None:
        return None
    return list(struct.unpack(f"<{count}q", body))


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def options_json(options: EngineOptions) -> str:
    return json.dumps(asdict(options))


def options_from_json(text: str) -> EngineOptions:
    data = json.loads(text)
    for key in ("thinker_gpus", "image_encoder_gpus"):
        data[key] = tuple(data[key])
    return EngineOptions(**data)


def init_group(*, rank: int, world: int, init_method: str, device: torch.device) -> None:
    import torch.distributed as dist

    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group(
            "nccl",
            init_method=init_method,
            rank=rank,
            world_size=world,
            timeout=INIT_TIMEOUT,
            device_id=device,
        )
    else:
        dist.init_process_group(
            "gloo", init_method=init_method, rank=rank, world_size=world, timeout=INIT_TIMEOUT
        )


def thinker_gpu(options: EngineOptions, rank: int) -> int:
    """Pod-local GPU id of a thinker rank: --thinker-gpus, else 0..tp-1."""
    return options.thinker_gpus[rank] if options.thinker_gpus else rank


def vision_gpu(options: EngineOptions, rank: int) -> int:
    """Pod-local GPU id of an image-encoder rank: --image-encoder-gpus, else 0..tp-1."""
    return options.image_encoder_gpus[rank] if options.image_encoder_gpus else rank


ROLES = {"thinker": "thinker", "image_encoder": "image-encoder"}  # role -> label in log lines


class TPLeader:
    """Rank 0's handle on its followers: spawn, rendezvous, op broadcast, watchdog, shutdown."""

    def __init__(self, options: EngineOptions, *, model_path: Path | None, role: str = "thinker") -> None:
        import torch.distributed as dist

        self.role, self.label = role, ROLES[role]
        param = f"{role}_tp_size"
        if dist.is_initialized():  # the group is this process's default group: one per process
            raise EngineError(
                f"this process already leads a tensor-parallel group; run one TP {self.label} per process",
                param=param,
            )
        self.world = options.thinker_tp_size if role == "thinker" else options.image_encoder_tp_size
        self.init_method = f"tcp://127.0.0.1:{free_port()}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.closing = False
        self.connected = False
        self._lock = threading.Lock()
        runtime_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (runtime_root, env.get("PYTHONPATH", "")) if p)
        for rank in range(1, self.world):
            cmd = [
                sys.executable,
                "-m",
                "omni_runtime.entrypoints.tp_follower",
                "--rank",
                str(rank),
                "--world",
                str(self.world),
                "--init-method",
                self.init_method,
                "--model-path",
                str(model_path) if model_path is not None else "",
                "--options",
                options_json(options),
                "--role",
                role,
            ]
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, env=env)
            self.procs.append(proc)
            gpu = thinker_gpu(options, rank) if role == "thinker" else vision_gpu(options, rank)
            log.info(
                "%s TP rank %d/%d: follower pid %d on %s",
                self.label,
                rank,
                self.world,
                proc.pid,
                "cpu" if options.device == "cpu" else f"GPU {gpu}",
            )
        atexit.register(self.close)
        self._watchdog = threading.Thread(target=self._watch, name="tp-watchdog", daemon=True)
        self._watchdog.start()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def connect(self, device: torch.device) -> None:
        """Join the group as rank 0 (blocks until every follower has loaded its shard)."""
        init_group(rank=0, world=self.world, init_method=self.init_method, device=device)
        self.connected = True
        log.info("%s TP group of %d ranks is up (%s)", self.label, self.world, self.init_method)

    # -- ops ----------------------------------------------------------------------------------------
    def send(self, *values: int) -> None:
        """An op header to every follower; a follower that is gone fails the op loudly."""
        data = pack([int(v) for v in values])
        for rank, proc in enumerate(self.procs, start=1):
            try:
                assert proc.stdin is not None
                proc.stdin.write(data)
                proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError) as exc:
                raise EngineError(
                    f"{self.label} TP rank {rank} (pid {proc.pid}) is gone ({exc}); restart the worker",
                    status=500,
                ) from exc

    def broadcast(self, tensor: torch.Tensor) -> None:
        import torch.distributed as dist

        dist.broadcast(tensor, src=0)

    def agree_slots(self, slots: int, max_len: int) -> int:
        """Every rank sizes its KV cache with the smallest slot count any rank fits."""
        import torch.distributed as dist

        self.send(OP_BUILD, slots, max_len)
        device = torch.device("cuda", torch.cuda.current_device()) if _nccl() else torch.device("cpu")
        value = torch.tensor([slots], dtype=torch.int64, device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        agreed = int(value.item())
        if agreed < 1:
            raise EngineError(
                f"a thinker TP rank cannot fit one request's KV cache ({max_len} tokens); lower --max-model-len "
                "or raise --mem-fraction-static",
                param="mem_fraction_static",
            )
        return agreed

    # -- lifecycle ------------------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self.closing:
            for rank, proc in enumerate(self.procs, start=1):
                code = proc.poll()
                if code is not None and not self.closing:
                    log.critical(
                        "%s TP rank %d (pid %d) exited with code %s; the %s cannot run without its "
                        "shard, so this process exits (its supervisor restarts it)",
                        self.label,
                        rank,
                        proc.pid,
                        code,
                        self.label,
                    )
                    self._kill_all()
                    logging.shutdown()
                    os._exit(1)
            time.sleep(0.2)

    def _kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()

    def close(self) -> None:
        """Stop the followers (STOP op, then EOF, then kill after a grace period) and leave the group."""
        with self._lock:
            if self.closing:
                return
            self.closing = True
        with contextlib.suppress(EngineError):
            self.send(OP_STOP)
        for proc in self.procs:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + 15
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s TP follower pid %d did not stop; killing it", self.label, proc.pid)
                proc.kill()
                proc.wait(timeout=5)
        if self.connected:
            import torch.distributed as dist

            # NCCL: no teardown here either (it could wait on a follower that was just killed);
            # the communicators go with the process, which is stopping.
            if dist.is_initialized() and dist.get_backend() != "nccl":
                try:
                    dist.destroy_process_group()
                except Exception:  # leaving a group whose peers are gone may complain; we are done anyway
                    log.debug("destroy_process_group failed", exc_info=True)
            self.connected = False
        log.info("%s TP followers stopped", self.label)


def _nccl() -> bool:
    import torch.distributed as dist

    return dist.is_initialized() and dist.get_backend() == "nccl"


def end_process_if_nccl(code: int) -> None:
    """End this process now with `code` when it holds an NCCL group; otherwise return.

    Every rank has stopped by the time a process ends, and there is nothing left to flush but its
    logs. Left to the interpreter, the group's destructor would shut its communicators down
    (ncclCommFinalize, then destroy), which waits on ranks that are already gone. On 2x H200 a
    rank outlived its stop grace period that way. So rank 0 (`omni serve`, `omni stage`) and the
    followers leave without it, as `os._exit` after the logs.
    """
    if not _nccl():
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
