"""Operator benchmark: N OmniDeployments x W workers on simulated GPU nodes.

Starts its own control plane (binaries from tests/e2e/controlplane/build.sh), enough kwok GPU nodes
for every worker, one `omni operator`, then creates all deployments at once and reports:
time until every deployment is Ready, API requests per reconcile (from the operator's own
per-reconcile accounting, split into passes that wrote and idle passes), and operator memory (RSS,
peak and at rest). Run:

    .venv/bin/python tests/e2e/bench_operator.py --deployments 100 --workers 4 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_cluster import running_control_plane, wait_for
from e2e_nodes import gpu_nodes
from e2e_operator import Api, OperatorProcess, deployment, install_crds

LINE = re.compile(r"reconcile (?P<ns>[^/]+)/(?P<name>\S+): (?P<reads>\d+) reads, (?P<writes>\d+) writes")


class MemorySampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.peak = 0
        self.last = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            try:
                self.last = self.proc.memory_info().rss
            except psutil.Error:
                return
            self.peak = max(self.peak, self.last)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--deployments", type=int, default=100)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument(
        "--idle-seconds", type=float, default=30.0, help="How long to watch idle resyncs after Ready."
    )
    p.add_argument("--resync-seconds", type=float, default=10.0)
    p.add_argument("--timeout", type=float, default=1200.0)
    p.add_argument("--json", type=Path, help="Also write the results as JSON here.")
    p.add_argument("--logs", type=Path, help="Copy the operator and control plane logs into this directory.")
    args = p.parse_args(argv)

    gpus = args.deployments * args.workers * 2  # thinker (1 GPU) + talker (1 GPU) per worker
    nodes = gpu_nodes(math.ceil(gpus / 8) + 1, gpus=8)
    print(
        f"[bench] {args.deployments} deployments x {args.workers} workers = {gpus} GPUs on {len(nodes)} nodes"
    )
    with (
        tempfile.TemporaryDirectory(prefix="omni-bench-") as tmp,
        running_control_plane(workdir=Path(tmp), nodes=nodes, build_if_missing=True) as cp,
    ):
        install_crds(cp)
        ns = "bench"
        with cp.https() as client:
            client.post(
                "/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            )
            wait_for(
                "default service account",
                lambda: client.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default").status_code == 200,
                timeout=60,
            )
        op = OperatorProcess(
            cp, ns, args=("--standalone", "--resync-seconds", str(args.resync_seconds))
        ).wait_live()
        sampler = MemorySampler(op.proc.pid)
        sampler.start()
        rss_start = psutil.Process(op.proc.pid).memory_info().rss
        api = Api(cp, ns)
        try:
            started = time.monotonic()
            for i in range(args.deployments):
                api.create(deployment(f"d{i:03d}", workers=args.workers))
            created = time.monotonic() - started
            print(f"[bench] created {args.deployments} OmniDeployments in {created:.1f} s")

            def ready_count() -> int:
                items = api.items("/apis/omni.dev/v1alpha1/namespaces/{ns}/omnideployments")
                return sum(
                    1
                    for d in items
                    if (d.get("status") or {}).get("phase") == "Ready"
                    and d["status"]["workers"]["ready"] == args.workers
                )

            last = -1
            deadline = started + args.timeout
            while (n := ready_count()) < args.deployments:
                if n != last:
                    print(
                        f"[bench] {n}/{args.deployments} Ready after {time.monotonic() - started:.0f} s",
                        flush=True,
                    )
                    last = n
                if time.monotonic() > deadline:
                    raise SystemExit(f"timed out: {n}/{args.deployments} Ready")
                time.sleep(1.0)
            to_ready = time.monotonic() - started
            print(f"[bench] all {args.deployments} Ready in {to_ready:.1f} s")
            lines_at_ready = len([m for m in LINE.finditer(op.log())])
            time.sleep(args.idle_seconds)
            rss_rest = sampler.last
        finally:
            sampler.stopped.set()
            op.stop()
            api.close()

        passes = [(int(m["reads"]), int(m["writes"])) for m in LINE.finditer(op.log())]
        busy = [p for p in passes[:lines_at_ready] if p[1] > 0]
        idle = [p for p in passes if p[1] == 0]
        result = {
            "deployments": args.deployments,
            "workers_per_deployment": args.workers,
            "pods": args.deployments * args.workers * 3,
            "nodes": len(nodes),
            "seconds_to_create": round(created, 1),
            "seconds_to_all_ready": round(to_ready, 1),
            "reconciles_until_ready": lines_at_ready,
            "reconciles_per_deployment_until_ready": round(lines_at_ready / args.deployments, 2),
            "writing_reconciles": len(busy),
            "reads_per_reconcile": round(statistics.mean(p[0] for p in passes), 2) if passes else None,
            "writes_per_writing_reconcile": round(statistics.mean(p[1] for p in busy), 2) if busy else None,
            "idle_reconciles": len(idle),
            "writes_per_idle_reconcile": max((p[1] for p in idle), default=0),
            "total_requests_until_ready": sum(r + w for r, w in passes[:lines_at_ready]),
            "operator_rss_mib_start": round(rss_start / 2**20, 1),
            "operator_rss_mib_peak": round(sampler.peak / 2**20, 1),
            "operator_rss_mib_at_rest": round(rss_rest / 2**20, 1),
        }
        if args.logs:
            shutil.copytree(cp.workdir / "logs", args.logs, dirs_exist_ok=True)
        print(json.dumps(result, indent=2))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
