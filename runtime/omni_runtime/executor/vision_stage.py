"""The image encoder's own stage process, for a process that hosts it next to other stages.

Image-encoder TP needs a torch.distributed group, and a process has one default group, which a
worker with thinker TP already uses. So when a worker (``omni serve``) or a multi-stage
``omni stage`` is asked for --image-encoder-tp-size N > 1, it starts
``python -m omni_runtime.entrypoints.stage --stages image_encoder --image-encoder-tp-size N ...`` on a
loopback port (exactly what the operator's dedicated image-encoder pod runs), and its
LocalStages sends image_encoder calls there over a stage link. That child is vision rank 0 and
spawns its own followers (tp_group, ``role="image_encoder"``).

Lifetimes are tied both ways: the child runs in its own session (a terminal's Ctrl-C reaches the
parent only, which stops the child with SIGTERM), it exits when its parent is gone
(``--parent-pid``), and a child that dies first takes the parent down with a clear log line
(exit 1), as a dead TP follower does: a worker that cannot encode images is not healthy.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from omni_runtime.contract.options import EngineOptions
from omni_runtime.executor.tp_group import free_port

log = logging.getLogger(__name__)
STOP_GRACE_S = 30.0


def child_command(options: EngineOptions, *, model_path: Path | None, port: int) -> list[str]:
    """The `omni stage` command line of the image-encoder stage (model and vision flags only)."""
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
    cmd = [
        sys.executable,
        "-m",
        "omni_runtime.entrypoints.stage",
        "--stages",
        "image_encoder",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--parent-pid",
        str(os.getpid()),
        "--device",
        options.device,
        "--dtype",
        options.dtype,
        "--load-format",
        options.load_format,
        "--image-encoder-tp-size",
        str(options.image_encoder_tp_size),
        "--worker-id",
        options.worker_id,
        "--revision",
        options.revision,
        "--log-level",
        level if level in ("debug", "info", "warning", "error") else "info",
    ]
    if model_path is not None:
        cmd += ["--model-path", str(model_path)]
    if options.image_encoder_gpus:
        cmd += ["--image-encoder-gpus", ",".join(str(g) for g in options.image_encoder_gpus)]
    return cmd


class VisionStageChild:
    """Spawn, supervise and stop the image-encoder stage process."""

    def __init__(self, options: EngineOptions, *, model_path: Path | None) -> None:
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        self.closing = False
        self._lock = threading.Lock()
        runtime_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (runtime_root, env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen(
            child_command(options, model_path=model_path, port=port),
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        log.info(
            "image-encoder TP of %d ranks runs in its own stage process: pid %d on %s",
            options.image_encoder_tp_size,
            self.proc.pid,
            self.address,
        )
        atexit.register(self.close)
        threading.Thread(target=self._watch, name="vision-stage-watchdog", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _watch(self) -> None:
        while not self.closing:
            code = self.proc.poll()
            if code is not None and not self.closing:
                log.critical(
                    "the image-encoder stage process (pid %d) exited with code %s; this process cannot "
                    "encode images without it, so it exits (its supervisor restarts it)",
                    self.proc.pid,
                    code,
                )
                logging.shutdown()
                os._exit(1)
            time.sleep(0.2)

    def close(self) -> None:
        """SIGTERM (the stage stops its followers and exits 0), then kill after a grace period."""
        with self._lock:
            if self.closing:
                return
            self.closing = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                log.warning("the image-encoder stage (pid %d) did not stop; killing it", self.proc.pid)
                self.proc.kill()
                self.proc.wait(timeout=5)
        log.info("image-encoder stage process stopped (exit code %s)", self.proc.returncode)
