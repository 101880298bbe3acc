"""spec.runtime.env: environment variables for every stage process, and the names it may not hold.

The runtimes read switches from their environment (the builtin runtime's OMNI_BUSY_STREAMS,
OMNI_SUFFIX_GRAPHS, OMNI_WARM_SPOKEN_AUDIO, OMNI_STREAM_PRIORITIES, ...); this is how a deployment
sets them. Names the operator sets on the stage processes itself are refused, because a value the
spec gave there would be overwritten, or would move a cache off the one writable volume, or pin the
wrong GPUs. The renderer, the planner and local mode write these names; tests in unit/render and
unit/local check that every name they write is listed in OPERATOR_ENV.

The same (reason, fix) words serve the loader (SpecError) and the CRD's CEL rules (crdgen), so
`omni plan` and `kubectl apply` refuse a name with one message.
"""

from __future__ import annotations

import re

from omni_runtime.contract import switches

FIELD = "spec.runtime.env"
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# The longest value (characters): switches are short, and the bound keeps the CEL rules that read
# a value (the builtin runtime's switch formats) within the API server's cost budget.
VALUE_MAX_LENGTH = 4096

_CACHE = "a cache in the pod's writable cache volume"
_RENDEZVOUS = "the rendezvous of a thinker spread over several nodes"

OPERATOR_ENV: dict[str, str] = {
    "HOME": "a writable home beside the read-only root filesystem",
    "OMNI_CACHE_DIR": "the pod's writable cache volume",
    "HF_HOME": _CACHE,
    "XDG_CACHE_HOME": _CACHE,
    "TRITON_CACHE_DIR": _CACHE,
    "TORCHINDUCTOR_CACHE_DIR": _CACHE,
    "CUDA_VISIBLE_DEVICES": "the GPUs the plan gives each process",
    "MASTER_ADDR": _RENDEZVOUS,
    "MASTER_PORT": _RENDEZVOUS,
    "NODE_RANK": _RENDEZVOUS,
    "NNODES": _RENDEZVOUS,
    "OMNI_VLLM_OMNI_DEPLOY_DIR": "vllm-omni's shipped deploy configs",
}
"""Names the operator sets on stage pods or local stage processes -> what it points them at.

OMP_NUM_THREADS is not here on purpose: the renderer sizes it by a CPU-only container's limit only
when the spec leaves it unset (render.common.cpu_thread_env), and the runtime reads it as the
override of its one-thread default on GPU processes."""

BAD_NAME_REASON = "is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
BAD_NAME_FIX = "use letters, digits and _, not starting with a digit"
RESERVED_FIX = "remove it from runtime.env"


class EntryError(ValueError):
    """A validator's error about one entry of a mapping field. Pydantic's location stops at the
    field (spec.runtime.env); the loader appends `entry`, so the message names spec.runtime.env.HOME."""

    def __init__(self, entry: str, *, reason: str, fix: str) -> None:
        self.entry, self.reason, self.fix = entry, reason, fix
        super().__init__(f"{reason}; {fix}")


def reserved_reason(name: str) -> str:
    return f"is set by the operator ({OPERATOR_ENV[name]})"


def message(name: str, reason: str, fix: str) -> str:
    """The loader's words without the file: what the CRD's CEL rules say."""
    return f"{FIELD}.{name}: {reason}; {fix}"


def check_env(env: dict[str, str], *, builtin: bool = False) -> dict[str, str]:
    """`env` itself when every name may be set; else EntryError for the first name that may not.
    For the builtin runtime also its switches' values (flags, choices, value formats) and names one
    letter off a switch's, in the words `omni serve` refuses them with (omni_runtime.contract.switches)."""
    for name, value in env.items():
        if not re.fullmatch(NAME_PATTERN, name):
            raise EntryError(name, reason=BAD_NAME_REASON, fix=BAD_NAME_FIX)
        if name in OPERATOR_ENV:
            raise EntryError(name, reason=reserved_reason(name), fix=RESERVED_FIX)
        if builtin and (wrong := switches.problem(name, value)) is not None:
            raise EntryError(name, reason=wrong[0], fix=wrong[1])
    return env
