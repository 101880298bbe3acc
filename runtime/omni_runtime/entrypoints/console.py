"""Quiet consoles for the runtime's processes: no access-log line per probe, no noise at exit.

`QuietProbes` drops uvicorn's access-log line for a successful /ready or /health: supervisors
(`omni up`, the kubelet, the router's health loop) probe every second or so, forever, and those
lines buried everything else. Failed probes and every other request are still logged.

`end_process` ends a process that has stopped in order (server closed, engine shut down) without
the interpreter's teardown. The heap frozen after warm-up (support.gc_pauses) is never collected,
so at teardown the objects of extension modules are still alive, and nanobind (Triton's
bindings) printed hundreds of "nanobind: leaked ..." lines per process on every Ctrl-C. Nothing
is left to flush but the logs, which this flushes first; `omni serve` already ended this way with
an NCCL group (executor.tp_group.end_process_if_nccl).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn

PROBE_PATHS = frozenset({"/ready", "/health"})


class QuietProbes(logging.Filter):
    """A filter for the `uvicorn.access` logger: leave out 2xx answers to the probe paths."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        # uvicorn's access record: (client address, method, path with query, HTTP version, status)
        if not isinstance(args, tuple) or len(args) != 5:
            return True
        path, status = str(args[2]).partition("?")[0], args[4]
        return not (path in PROBE_PATHS and isinstance(status, int) and 200 <= status < 300)


def quiet_probes() -> None:
    """Install QuietProbes on uvicorn's access logger (after uvicorn configured its logging)."""
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(existing, QuietProbes) for existing in access.filters):
        access.addFilter(QuietProbes())


def end_process(code: int) -> NoReturn:
    """Flush the logs and the standard streams, then end the process with `code` at once."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
