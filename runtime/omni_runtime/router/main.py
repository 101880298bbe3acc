"""`omni router`: run the session router in front of workers.

    omni router --port 8000 --workers-file workers.json
    omni router --port 8000 --source kubernetes --namespace NS --deployment NAME

The worker table is loaded before the server starts, so a bad file or a missing cluster is a
one-line error naming the flag, not a traceback.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from collections.abc import Callable
from typing import Any

from omni_runtime.router import logs
from omni_runtime.router.auth import load_api_keys
from omni_runtime.router.context import RouterConfig
from omni_runtime.router.head_limit import DEFAULT_MAX_HEADER_BYTES, head_limited_protocol
from omni_runtime.router.sources import FileSource, WorkerSource, WorkerTableError

log = logging.getLogger("omni.router")


def _positive(kind: Callable[[str], float]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0, got {text!r}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="omni router", description="Run the session router in front of workers."
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 for every interface, "
        "as the router's pods do)",
    )
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    parser.add_argument(
        "--source",
        choices=["file", "kubernetes"],
        default=None,
        help="where the worker table comes from (default: file when --workers-file is given)",
    )
    parser.add_argument(
        "--workers-file",
        help='JSON worker table {"workers": [{"id", "url", "revision", "state"}]}; re-read when it changes',
    )
    parser.add_argument("--namespace", help="Kubernetes namespace of the workers (--source kubernetes)")
    parser.add_argument(
        "--deployment", help="OmniDeployment name whose worker Services to watch (--source kubernetes)"
    )
    parser.add_argument(
        "--session-header",
        default="X-Session-Id",
        help="header carrying a client session key for sticky routing (default X-Session-Id)",
    )
    parser.add_argument(
        "--max-sessions-per-worker",
        type=int,
        default=0,
        help="live sessions a worker may hold before it takes no more; 0 = no limit (default)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=_positive(int),
        default=100 * 1024 * 1024,
        help="largest request body or WebSocket message accepted (default 100 MiB)",
    )
    parser.add_argument(
        "--upstream-timeout",
        type=_positive(float),
        default=600.0,
        help="seconds a worker may stay silent before the request fails with 504 (default 600)",
    )
    parser.add_argument(
        "--connect-timeout",
        type=_positive(float),
        default=5.0,
        help="seconds to connect to a worker (default 5)",
    )
    parser.add_argument(
        "--health-interval",
        type=_positive(float),
        default=1.0,
        help="seconds between /ready checks of each worker (default 1)",
    )
    parser.add_argument(
        "--api-keys-file",
        help="file of client API keys, one per line; clients then need "
        "`Authorization: Bearer <key>` (/health, /ready, /metrics stay open)",
    )
    parser.add_argument(
        "--admin-keys-file",
        help="file of admin keys, one per line: the admin API (/admin/...) then needs "
        "`Authorization: Bearer <admin key>` (client API keys are refused); without it the admin "
        "API answers only on loopback",
    )
    parser.add_argument(
        "--max-header-bytes",
        type=_positive(int),
        default=DEFAULT_MAX_HEADER_BYTES,
        help="largest request line plus headers accepted; larger heads are answered 431 "
        f"(default {DEFAULT_MAX_HEADER_BYTES // 1024} KiB)",
    )
    parser.add_argument(
        "--processes",
        type=_positive(int),
        default=1,
        help="router processes sharing the port (SO_REUSEPORT), each a full replica (default 1); "
        "with more than 1, drain workers through the worker table, not the admin API",
    )
    parser.add_argument("--replica-fd", type=int, help=argparse.SUPPRESS)  # set by --processes
    parser.add_argument("--replica", default="0/1", help=argparse.SUPPRESS)  # "index/count"
    # Set by --processes: where the replicas' private sockets live (one /metrics for all of them).
    parser.add_argument("--replica-metrics-dir", help=argparse.SUPPRESS)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--no-request-log", action="store_true", help="do not log one JSON line per request")
    return parser


def build_source(args: argparse.Namespace) -> WorkerSource:
    source = args.source or ("file" if args.workers_file else None)
    if source is None:
        raise WorkerTableError(
            "give --workers-file FILE, or --source kubernetes --namespace NS --deployment NAME"
        )
    if source == "file":
        if not args.workers_file:
            raise WorkerTableError("--source file needs --workers-file FILE")
        return FileSource(args.workers_file)
    if not args.namespace or not args.deployment:
        raise WorkerTableError("--source kubernetes needs --namespace NS and --deployment NAME")
    if args.workers_file:
        raise WorkerTableError("--workers-file cannot be combined with --source kubernetes; choose one")
    from omni_runtime.router.k8s_source import KubernetesSource

    return KubernetesSource(namespace=args.namespace, deployment=args.deployment)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.max_sessions_per_worker < 0:
        print("omni router: error: --max-sessions-per-worker must be 0 (no limit) or more", file=sys.stderr)
        return 2
    if args.processes > 1 and (args.source or "file") == "kubernetes":
        print(
            "omni router: error: --processes works with --workers-file only; with --source kubernetes "
            "each router pod reports its live sessions on draining workers as one replica, so scale "
            "the router's pod replicas instead",
            file=sys.stderr,
        )
        return 2
    try:
        source = build_source(args)
        initial = source.load()
        api_keys = load_api_keys(args.api_keys_file) if args.api_keys_file else ()
        admin_keys = (
            load_api_keys(args.admin_keys_file, flag="--admin-keys-file") if args.admin_keys_file else ()
        )
    except WorkerTableError as exc:
        print(f"omni router: error: {exc}", file=sys.stderr)
        return 2
    if args.processes > 1 and args.replica_fd is None:
        return _run_replicas(args, argv)

    import uvicorn

    from omni_runtime.router.app import RouterApp

    logs.configure(args.log_level)
    # One series per counter is enough for a scraper; the *_created companions only add noise.
    from prometheus_client import disable_created_metrics

    disable_created_metrics()
    index, _, count = args.replica.partition("/")
    config = RouterConfig(
        processes=int(count),
        replica=int(index),
        metrics_dir=args.replica_metrics_dir,
        session_header=args.session_header,
        max_sessions_per_worker=args.max_sessions_per_worker,
        max_body_bytes=args.max_body_bytes,
        upstream_timeout=args.upstream_timeout,
        connect_timeout=args.connect_timeout,
        health_interval=args.health_interval,
        api_keys=api_keys,
        admin_keys=admin_keys,
        max_header_bytes=args.max_header_bytes,
        log_requests=not args.no_request_log,
        gc_freeze=True,
    )
    app = RouterApp(config=config, source=source, initial=initial)
    sockets = None
    if args.replica_fd is not None:  # a replica of `--processes N`: serve on the parent's socket
        from omni_runtime.router.replicas import watch_parent

        watch_parent()
        sockets = [socket.socket(fileno=args.replica_fd)]
        if args.replica_metrics_dir:  # siblings read this replica's own /metrics here
            from omni_runtime.router.replicas import bind_replica_socket

            sockets.append(bind_replica_socket(args.replica_metrics_dir, int(index)))
        log.info(
            "router replica starting",
            extra={"fields": {"event": "replica", "replica": int(index), "processes": int(count)}},
        )
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_config=None,
            access_log=False,
            server_header=False,  # the worker's own headers pass through
            date_header=False,
            lifespan="on",
            ws_max_size=args.max_body_bytes,
            http=head_limited_protocol(args.max_header_bytes),  # 431 for heads over the limit
            timeout_graceful_shutdown=10,
        )
    )
    server.run(sockets=sockets)
    return 0 if server.started else 1


def _run_replicas(args: argparse.Namespace, argv: list[str]) -> int:
    from omni_runtime.router.replicas import PortInUse, Replicas, bind_group

    try:
        sockets = bind_group(args.host, args.port, args.processes)
    except PortInUse as exc:
        print(f"omni router: error: {exc}", file=sys.stderr)
        return 2
    return Replicas(argv=_without_processes(argv), sockets=sockets).run()


def _without_processes(argv: list[str]) -> list[str]:
    """The flags again, less --processes (in either spelling), for the replicas."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--processes":
            skip = True
        elif not arg.startswith("--processes="):
            kept.append(arg)
    return kept


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
