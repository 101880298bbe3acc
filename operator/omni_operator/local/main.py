"""`omni up`: run an OmniDeployment on this machine as local processes behind the router."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from omni_operator.api.load import SpecError, load_deployments
from omni_operator.local.default import DEFAULT_DEPLOYMENT_YAML
from omni_operator.local.processes import LocalCapacityError, check_capacity, process_specs, router_spec
from omni_operator.local.supervisor import Supervisor
from omni_operator.plan.planner import plan_deployment
from omni_operator.plan.types import PlanError, Target


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="omni up",
        description="Run an OmniDeployment on this machine: every stage of every worker plus the router. "
        "With no -f, two workers of the tiny random-weight checkpoint.",
    )
    parser.add_argument(
        "-f", "--filename", help="OmniDeployment YAML (default: the embedded tiny deployment)"
    )
    parser.add_argument("--port", type=int, default=8000, help="router port (default 8000)")
    parser.add_argument("--base-port", type=int, default=8100, help="first port for worker processes")
    parser.add_argument("--gpu-offset", type=int, default=0, help="first host GPU to use")
    parser.add_argument("--state-dir", help="where the worker table lives (default ~/.cache/omni/up/<name>)")
    return parser


def count_gpus() -> int:
    """GPUs on this host as nvidia-smi sees them (0 without a driver)."""
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.filename:
            source = Path(args.filename)
        else:
            tmp = Path(tempfile.mkdtemp(prefix="omni-up-")) / "tiny-omni.yaml"
            tmp.write_text(DEFAULT_DEPLOYMENT_YAML)
            source = tmp
        deployments = load_deployments(source)
        if len(deployments) != 1:
            print(
                f"omni up: {source}: holds {len(deployments)} OmniDeployments; give one per file",
                file=sys.stderr,
            )
            return 2
        dep = deployments[0]
        state_dir = Path(args.state_dir or Path.home() / ".cache" / "omni" / "up" / dep.metadata.name)
        workers_file = state_dir / "workers.json"
        plan = plan_deployment(
            dep,
            target=Target.local,
            base_port=args.base_port,
            router_port=args.port,
            gpu_offset=args.gpu_offset,
            workers_file=str(workers_file),
        )
        check_capacity(plan=plan, available_gpus=count_gpus(), gpu_offset=args.gpu_offset)
    except (SpecError, PlanError, LocalCapacityError) as err:
        print(f"omni up: error: {err}", file=sys.stderr)
        return 2
    supervisor = Supervisor(
        plan=plan,
        workers_file=workers_file,
        processes=process_specs(plan=plan),
        router=router_spec(plan=plan),
    )
    return asyncio.run(supervisor.run())
