"""`omni operator`: run the Kubernetes operator (kopf, in this process).

One namespace (`--namespace`, repeatable) or all of them (`--all-namespaces`); a liveness endpoint
for the pod's probe; kopf peering so that of several replicas exactly one is active. Replicas get
distinct priorities by default (earlier start wins), because kopf pauses *all* replicas that share
a priority; a standby takes over once the active replica's peering record expires
(`--peering-lifetime`).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import random
import sys
import time


def _default_priority() -> int:
    # Earlier start -> higher priority, so a restarted or added replica never preempts a running
    # one; the random part separates replicas started within the same millisecond.
    return 10**13 - int(time.time() * 1000) * 1000 - random.randrange(1000)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omni operator", description="Run the OmniDeployment operator.")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        metavar="NS",
        help="Serve OmniDeployments in this namespace (repeatable). Default: $POD_NAMESPACE or all namespaces.",
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="Serve every namespace.")
    p.add_argument(
        "--kubeconfig", help="Kubeconfig file (default: in-cluster credentials, then $KUBECONFIG)."
    )
    p.add_argument(
        "--liveness-port",
        type=int,
        default=8080,
        help="Port of the /healthz liveness endpoint (0 turns it off).",
    )
    p.add_argument(
        "--peering",
        default="omni-operator",
        metavar="NAME",
        help="kopf peering object shared by the replicas (created if missing).",
    )
    p.add_argument("--standalone", action="store_true", help="No peering: this is the only replica.")
    p.add_argument("--priority", type=int, help="Peering priority (default: earlier start wins).")
    p.add_argument(
        "--peering-lifetime",
        type=int,
        default=60,
        help="Seconds a replica's peering record lives without keep-alive (failover time).",
    )
    p.add_argument(
        "--resync-seconds", type=float, default=60.0, help="Reconcile each deployment at least this often."
    )
    p.add_argument("--verbose", "-v", action="store_true", help="Verbose kopf logging.")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.liveness_port < 0 or args.liveness_port > 65535:
        print(
            f"omni operator: --liveness-port {args.liveness_port} is not a port; use 0-65535", file=sys.stderr
        )
        return 2
    if not (math.isfinite(args.resync_seconds) and args.resync_seconds > 0):
        print(
            f"omni operator: --resync-seconds {args.resync_seconds}: expected a number of seconds above 0 "
            "(default 60)",
            file=sys.stderr,
        )
        return 2
    if args.peering_lifetime < 1:
        print(
            f"omni operator: --peering-lifetime {args.peering_lifetime}: expected 1 or more seconds (default 60)",
            file=sys.stderr,
        )
        return 2
    if args.kubeconfig:
        if not os.path.isfile(args.kubeconfig):
            print(
                f"omni operator: --kubeconfig {args.kubeconfig} does not exist; pass a kubeconfig file",
                file=sys.stderr,
            )
            return 2
        os.environ["KUBECONFIG"] = args.kubeconfig  # read by kopf's login and by k8s.Kube alike

    namespaces = list(args.namespace)
    if not namespaces and not args.all_namespaces and os.environ.get("POD_NAMESPACE"):
        namespaces = [os.environ["POD_NAMESPACE"]]
    clusterwide = not namespaces

    import kopf  # imported only when the operator runs (the CLI stays light)

    from omni_operator import handlers, k8s

    try:  # before kopf starts: without credentials its startup would retry forever
        k8s.Kube.connect(args.kubeconfig)
    except k8s.NoCredentialsError as err:
        print(f"omni operator: error: {err}", file=sys.stderr)
        return 2

    handlers.OPTIONS.kubeconfig = args.kubeconfig
    handlers.OPTIONS.peering_name = None if args.standalone else args.peering
    handlers.OPTIONS.peering_namespaces = tuple(namespaces)
    handlers.OPTIONS.peering_lifetime = args.peering_lifetime
    handlers.OPTIONS.resync_seconds = args.resync_seconds
    kopf.configure(verbose=args.verbose)
    if not args.verbose:
        # kopf logs every handled watch event at INFO ("Handler 'pod_event' succeeded"): thousands a
        # minute in a busy cluster. Its warnings and errors still show.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    kopf.run(
        clusterwide=clusterwide,
        namespaces=namespaces,
        standalone=True if args.standalone else None,
        peering_name=None if args.standalone else args.peering,
        priority=args.priority if args.priority is not None else _default_priority(),
        liveness_endpoint=f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None,
    )
    return 0
