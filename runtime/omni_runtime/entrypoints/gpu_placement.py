"""Check that a running worker's processes sit on the GPUs its flags place them on (nvidia-smi).

    python -m omni_runtime.entrypoints.gpu_placement -- --thinker-tp-size 4 --thinker-gpus 0,1,2,3 \\
        --talker-gpu 4 --image-encoder-tp-size 2 --image-encoder-gpus 5,6 [other omni serve flags]
    python -m omni_runtime.entrypoints.gpu_placement --expect 'stage talker,segmenter,talker_stream=4' ...

The flags after `--` are the worker's `omni serve` flags. From them `expected_gpus` derives, per
process role, the GPUs that process may use: the worker (thinker rank 0, the talker, the encoders
that are not split off), each thinker follower rank, and each rank of an image-encoder stage.
`nvidia-smi` says which process holds memory on which GPU; each process's role is read from its
command line. Every mismatch is printed — a process on a GPU it should not touch, a rank missing,
a GPU two roles share, a process nobody expected — and the exit code is 1 if there is any.
The pure parts (`expected_gpus`, `role_of`, `problems`) are table-tested on the CPU.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from omni_runtime.contract.options import EngineOptions

WORKER = "worker"


def thinker_role(rank: int) -> str:
    return WORKER if rank == 0 else f"thinker rank {rank}"


def vision_role(rank: int) -> str:
    return f"image_encoder rank {rank}"


def expected_gpus(options: EngineOptions) -> dict[str, set[int]]:
    """Role -> the GPUs its process may hold memory on, as `omni serve` places the stages."""
    thinker = list(options.thinker_gpus) or list(range(options.thinker_tp_size))
    roles: dict[str, set[int]] = {thinker_role(rank): {gpu} for rank, gpu in enumerate(thinker)}
    has_talker = options.pipeline != "text" and not options.text_only
    if has_talker and options.talker_gpu is not None:
        roles[WORKER].add(options.talker_gpu)
    if options.image_encoder_tp_size > 1:
        vision = list(options.image_encoder_gpus) or list(range(options.image_encoder_tp_size))
        roles.update({vision_role(rank): {gpu} for rank, gpu in enumerate(vision)})
    return roles


def parse_expectations(items: Sequence[str]) -> dict[str, set[int]]:
    """--expect 'ROLE=0,4' items as role -> GPUs."""
    expected: dict[str, set[int]] = {}
    for item in items:
        role, sep, gpus = item.rpartition("=")
        try:
            indices = {int(g) for g in gpus.split(",") if g.strip()}
        except ValueError:
            indices = set()
        if not sep or not role.strip() or not indices:
            raise ValueError(
                f"--expect {item!r}: expected ROLE=GPUS, e.g. 'thinker rank 1=1' or 'worker=0,4'"
            )
        expected.setdefault(role.strip(), set()).update(indices)
    return expected


def _flag(argv: Sequence[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def role_of(argv: Sequence[str]) -> str | None:
    """The role of a process from its command line; None for a process that is not ours."""
    joined = " ".join(argv)
    if "omni_runtime.entrypoints.tp_follower" in joined:
        rank = int(_flag(argv, "--rank") or 0)
        return vision_role(rank) if _flag(argv, "--role") == "image_encoder" else thinker_role(rank)
    if "omni_runtime.entrypoints.stage" in joined or (
        len(argv) > 1 and Path(argv[0]).name == "omni" and argv[1] == "stage"
    ):
        stages = (_flag(argv, "--stages") or "").split(",")
        return vision_role(0) if "image_encoder" in stages else "stage " + ",".join(stages)
    if any(Path(a).name == "omni" for a in argv[:2]) or "omni_operator.cli" in joined:
        return WORKER if "serve" in argv else None
    return None


def problems(expected: dict[str, set[int]], observed: dict[str, set[int]]) -> list[str]:
    """Every way the observed placement (role -> GPUs its processes hold) departs from the plan."""
    found: list[str] = []
    for role, gpus in sorted(expected.items()):
        seen = observed.get(role)
        if not seen:
            found.append(f"{role}: expected on GPU {_gpus(gpus)}, but no such process holds GPU memory")
        elif seen - gpus:
            found.append(f"{role}: on GPU {_gpus(seen)}, but the plan puts it on GPU {_gpus(gpus)} only")
        elif gpus - seen:
            found.append(f"{role}: holds no memory on GPU {_gpus(gpus - seen)}, where the plan puts it")
    for role in sorted(set(observed) - set(expected)):
        found.append(f"{role}: on GPU {_gpus(observed[role])}, but the plan has no such process")
    owners: dict[int, list[str]] = {}
    for role, gpus in observed.items():
        for gpu in gpus:
            owners.setdefault(gpu, []).append(role)
    for gpu, roles in sorted(owners.items()):
        if len(roles) > 1 and not all(gpu in expected.get(r, set()) for r in roles):
            found.append(f"GPU {gpu}: shared by {', '.join(sorted(roles))}, which the plan keeps apart")
    return found


def _gpus(gpus: set[int]) -> str:
    return ",".join(str(g) for g in sorted(gpus))


# ---- I/O: nvidia-smi and /proc -----------------------------------------------------------------


def _smi(query: str) -> list[list[str]]:
    text = subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True
    ).stdout
    return [[cell.strip() for cell in line.split(",")] for line in text.splitlines() if line.strip()]


def observe() -> tuple[dict[str, set[int]], list[str]]:
    """(role -> GPUs, one line per GPU process) from nvidia-smi and the processes' command lines."""
    index = {uuid: int(i) for i, uuid in _smi("--query-gpu=index,uuid")}
    observed: dict[str, set[int]] = {}
    lines = []
    for pid, uuid, used in _smi("--query-compute-apps=pid,gpu_uuid,used_memory"):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            argv = []
        role = role_of(argv) or f"pid {pid} (not an omni process)"
        observed.setdefault(role, set()).add(index[uuid])
        lines.append(f"GPU {index[uuid]}  pid {pid:>7}  {used:>6} MiB  {role}")
    return observed, sorted(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m omni_runtime.entrypoints.gpu_placement", description=__doc__
    )
    parser.add_argument(
        "serve_flags", nargs=argparse.REMAINDER, help="the worker's omni serve flags, after --"
    )
    args = parser.parse_args(argv)
    flags = [f for f in args.serve_flags if f != "--"]
    from omni_runtime.entrypoints.serve import parse_args

    options = parse_args(flags).options
    expected = expected_gpus(options)
    try:
        observed, lines = observe()
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"gpu_placement: cannot query nvidia-smi: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    print("plan: " + "; ".join(f"{role} on GPU {_gpus(gpus)}" for role, gpus in sorted(expected.items())))
    found = problems(expected, observed)
    for line in found:
        print("MISMATCH " + line)
    print("placement matches the plan" if not found else f"{len(found)} mismatch(es)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
