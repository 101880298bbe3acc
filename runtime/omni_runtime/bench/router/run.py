"""Router overhead benchmark: the same load straight to an upstream and through `omni router`, in one run.

    python -m omni_runtime.bench.router.run --out DIR [--upstream echo,worker] [--seconds 3] [--rounds 3]
        [--concurrency 1,64] [--ws-concurrency 8] [--max-tokens 8] [--client-processes N]
        [--model-path P] [--device auto|cpu|cuda] [--pipeline text] [--serve-arg=--flag=value ...]
        [--worker-url URL] [--router-arg=--processes=4 ...]

Two scenarios, each behind its own real `omni router` process (a worker-table file naming one
upstream), measured in one run:
- `worker` answers the issue's question: a real `omni serve` worker (the tiny checkpoint unless
  --model-path; --device and --pipeline pass through, --serve-arg adds any other flag; or
  --worker-url measures a running one). Loads: chat completions with --max-tokens tokens, whole
  and streamed (SSE, with time to first chunk), at each --concurrency; WebSocket round trips on
  /v1/realtime (`input_audio_buffer.clear` answered by `input_audio_buffer.cleared`, no model time).
  Before measuring, one answer of each kind is fetched both ways and compared in shape.
- `echo` is the worst-case stress line: a minimal upstream (raw ASGI on uvicorn) answering a small
  chat-completion JSON in 0 ms (--upstream-delay-ms to wait instead) and echoing WebSocket
  messages, so nothing hides the router's own cost.

Every load is warmed up on both paths, then direct and routed rounds alternate (so background load
hits both alike). Throughput is the median round's; latency percentiles pool every round's
requests. Full garbage collections of the worker and the router during the loads are read from
their /metrics and reported beside the table (a worker frozen at start has none). The CPU the router and the upstream
spend per request is read from /proc: a figure that does not depend on what else the machine does.
Prints a table and writes results.json and router_overhead.png to --out. Quote the hardware line.
"""

from __future__ import annotations

import argparse
import json
import math
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from omni_runtime.bench.router import report
from omni_runtime.bench.router.load import Load, LoadRunner, Sample, http_request, percentile_ms
from omni_runtime.bench.router.report import Measurement
from omni_runtime.bench.router.shapes import compare_shapes

MESSAGES = [{"role": "user", "content": "hi"}]
REALTIME_EVENT = json.dumps({"type": "input_audio_buffer.clear"})
WORKER_ID = "bench-w0"


# ---- processes --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(base_url: str, *, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"bench: the process for {base_url} exited with {proc.returncode}; see its log")
        try:
            if httpx.get(f"{base_url}/ready", timeout=2.0, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"bench: {base_url}/ready did not answer 200 within {timeout:g} s")


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def _worker_argv(args: argparse.Namespace, port: int) -> list[str]:
    argv = [sys.executable, "-m", "omni_operator.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--worker-id", WORKER_ID, "--pipeline", args.pipeline, "--device", args.device]
    argv += ["--log-level", "warning"]
    if args.model_path:
        argv += ["--model-path", args.model_path]
    return argv + args.serve_arg


def _router(work: Path, scenario: str, upstream_url: str, extra: list[str]) -> tuple[int, list[str]]:
    workers = work / f"workers-{scenario}.json"
    entry = {"id": WORKER_ID, "url": upstream_url, "revision": "bench", "state": "ready"}
    workers.write_text(json.dumps({"workers": [entry]}))
    port = free_port()
    argv = [sys.executable, "-m", "omni_runtime.router.main", "--host", "127.0.0.1", "--port", str(port)]
    return port, [*argv, "--workers-file", str(workers), *extra]


# ---- loads ------------------------------------------------------------------------------------


def chat_body(*, model: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    """A chat completion of exactly max_tokens text tokens (greedy, EOS ignored): equal work both ways."""
    return {
        "model": model,
        "messages": MESSAGES,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "modalities": ["text"],
        "stream": stream,
    }


def scenario_loads(
    scenario: str, *, host: str, port: int, model: str, args: argparse.Namespace
) -> list[tuple[str, Load]]:
    """(case, load) for one endpoint (the upstream or the router) of a scenario."""
    levels = [int(level) for level in args.concurrency.split(",") if level.strip()]
    loads: list[tuple[str, Load]] = []
    path = "/v1/chat/completions"
    if scenario == "echo":
        request = http_request(
            host=host,
            port=port,
            path=path,
            body=json.dumps(chat_body(model="bench", max_tokens=1, stream=False)).encode(),
        )
        loads += [
            ("chat", Load(kind="http", host=host, port=port, concurrency=c, request=request)) for c in levels
        ]
        if args.ws_concurrency:
            message = json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 256})
            ws = Load(
                kind="ws",
                host=host,
                port=port,
                concurrency=args.ws_concurrency,
                ws_path="/ws",
                ws_message=message,
            )
            loads.append(("ws_echo", ws))
        return loads
    for case, stream in (("chat", False), ("chat_stream", True)):
        body = json.dumps(chat_body(model=model, max_tokens=args.max_tokens, stream=stream)).encode()
        request = http_request(host=host, port=port, path=path, body=body)
        kind = "sse" if stream else "http"
        loads += [
            (case, Load(kind=kind, host=host, port=port, concurrency=c, request=request)) for c in levels
        ]
    if args.ws_concurrency:
        realtime = Load(
            kind="ws",
            host=host,
            port=port,
            concurrency=args.ws_concurrency,
            ws_path="/v1/realtime",
            ws_message=REALTIME_EVENT,
            ws_reply_type="input_audio_buffer.cleared",
            ws_ready_type="session.created",
        )
        loads.append(("ws_realtime", realtime))
    return loads


def measure(
    runner: LoadRunner,
    *,
    scenario: str,
    case: str,
    direct: Load,
    routed: Load,
    seconds: float,
    rounds: int,
    pids: dict[str, int],
    router_url: str | None = None,
) -> list[Measurement]:
    """Direct and routed rounds alternate, so background load falls on both alike.

    Throughput and CPU per request are the median round's; latency percentiles pool every round's
    requests (a p99 of one 3 s round rests on a handful of requests, and one pause in the worker
    moves it by the pause's length)."""
    for load in (routed, direct):  # warm connections, pools and caches on both paths
        runner.run(load, 0.5)
    by_target: dict[str, list[tuple[Sample, dict[str, float]]]] = {"direct": [], "router": []}
    own_before = overhead_buckets(router_url) if router_url and direct.kind != "ws" else {}
    for _ in range(rounds):
        for target, load in (("direct", direct), ("router", routed)):
            before = {name: report.cpu_seconds(pid) for name, pid in pids.items()}
            sample = runner.run(load, seconds)
            count = len(sample.latencies)
            cpu = {
                name: (report.cpu_seconds(pid) - before[name]) * 1e6 / max(1, count)
                for name, pid in pids.items()
            }
            by_target[target].append((sample, cpu))
            print(".", end="", flush=True)
    own_p99_ms = 0.0
    if own_before:
        own_after = overhead_buckets(router_url or "")
        own_p99_ms = report.histogram_quantile(own_after, own_before, 0.99) * 1000
    results = []
    for target, measured in by_target.items():
        load = direct if target == "direct" else routed
        rate = [len(sample.latencies) / sample.elapsed if sample.elapsed else 0.0 for sample, _ in measured]
        median = sorted(range(len(measured)), key=lambda i: rate[i])[len(measured) // 2]
        _, cpu = measured[median]
        pooled = Sample()
        for sample, _ in measured:
            pooled.merge(sample)
        results.append(
            Measurement(
                scenario=scenario,
                case=case,
                target=target,
                concurrency=load.concurrency,
                per_second=rate[median],
                p50_ms=percentile_ms(pooled.latencies, 0.5),
                p99_ms=percentile_ms(pooled.latencies, 0.99),
                first_chunk_p50_ms=percentile_ms(pooled.first_chunk, 0.5),
                first_chunk_p99_ms=percentile_ms(pooled.first_chunk, 0.99),
                count=len(pooled.latencies),
                errors=pooled.errors,
                upstream_cpu_us=round(cpu.get("upstream", 0.0), 1),
                router_cpu_us=round(cpu.get("router", 0.0), 1) if target == "router" else 0.0,
                router_own_p99_ms=round(own_p99_ms, 3) if target == "router" else 0.0,
            )
        )
    return results


def _metrics_text(base_url: str) -> str:
    import httpx

    return httpx.get(f"{base_url}/metrics", timeout=10, trust_env=False).text


def overhead_buckets(router_url: str) -> dict[float, float]:
    """The router's omni_router_overhead_seconds histogram now (every replica's with --processes,
    whose /metrics is merged): {le: cumulative count}."""
    buckets: dict[float, float] = {}
    prefix = 'omni_router_overhead_seconds_bucket{le="'
    for line in _metrics_text(router_url).splitlines():
        if line.startswith(prefix):
            le = line[len(prefix) : line.index('"}')]
            buckets[math.inf if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return buckets


def full_collections(base_url: str, prefix: str) -> tuple[int, float]:
    """(count, seconds) of the process's full garbage collections so far (every router replica's
    with --processes), from its /metrics."""
    import httpx

    try:
        text = _metrics_text(base_url)
    except httpx.HTTPError:
        return (0, 0.0)
    found = {"count": 0.0, "sum": 0.0}
    for line in text.splitlines():
        for what in found:
            if line.startswith(f'{prefix}_gc_pause_seconds_{what}{{generation="2"}} '):
                found[what] = float(line.rsplit(" ", 1)[1])
    return int(found["count"]), found["sum"]


# ---- the run ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m omni_runtime.bench.router.run", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--out", required=True, help="folder for results.json and router_overhead.png")
    parser.add_argument(
        "--upstream", default="echo,worker", help="scenarios, comma list of echo and worker (default both)"
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one measured round (default 3)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds per load: the median round's throughput, latencies pooled over all",
    )
    parser.add_argument("--concurrency", default="1,64", help="HTTP client counts, comma list (default 1,64)")
    parser.add_argument(
        "--ws-concurrency", type=int, default=8, help="WebSocket connections; 0 skips (default 8)"
    )
    parser.add_argument(
        "--client-processes", type=int, default=1, help="client processes sharing each load (default 1)"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=8, help="worker: tokens per chat completion (default 8)"
    )
    parser.add_argument(
        "--model-path", help="worker: checkpoint for omni serve (default: the tiny checkpoint)"
    )
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="worker: --device")
    parser.add_argument("--pipeline", default="text", help="worker: omni serve --pipeline (default text)")
    parser.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        help="worker: extra omni serve flag, e.g. --serve-arg=--load-format=dummy",
    )
    parser.add_argument("--worker-url", help="worker: measure this running worker instead of starting one")
    parser.add_argument(
        "--worker-timeout", type=float, default=900.0, help="worker: seconds to wait for /ready"
    )
    parser.add_argument("--upstream-delay-ms", type=float, default=0.0, help="echo: wait per answer")
    parser.add_argument(
        "--upstream-concurrency",
        type=int,
        default=0,
        help="echo: answer at most this many requests at once, first come first served (a saturated "
        "worker's shape without model noise); 0 = no limit",
    )
    parser.add_argument(
        "--router-arg", action="append", default=[], help="extra `omni router` flag (repeatable)"
    )
    return parser


def _run_scenario(
    scenario: str,
    args: argparse.Namespace,
    work: Path,
    runner: LoadRunner,
    procs: list[subprocess.Popen[bytes]],
) -> tuple[list[Measurement], dict[str, Any]]:
    upstream_proc = None
    if scenario == "worker" and args.worker_url:
        upstream_url = args.worker_url.rstrip("/")
        description = f"worker at {upstream_url}"
    else:
        port = free_port()
        upstream_url = f"http://127.0.0.1:{port}"
        if scenario == "echo":
            argv = [sys.executable, "-m", "omni_runtime.bench.router.echo", "--port", str(port)]
            argv += ["--delay-ms", str(args.upstream_delay_ms)]
            argv += ["--concurrency", str(args.upstream_concurrency)]
            description = f"echo upstream, {args.upstream_delay_ms:g} ms per answer (worst case for a proxy)"
            if args.upstream_concurrency:
                description += f", at most {args.upstream_concurrency} at once"
        else:
            argv = _worker_argv(args, port)
            description = f"omni serve {' '.join(argv[4:])}"
        upstream_proc = _start(argv, work / f"{scenario}-upstream.log")
        procs.append(upstream_proc)
    parts = urlsplit(upstream_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    router_port, router_argv = _router(work, scenario, upstream_url, args.router_arg)
    router_proc = _start(router_argv, work / f"{scenario}-router.log")
    procs.append(router_proc)
    wait_ready(upstream_url, timeout=args.worker_timeout if scenario == "worker" else 60, proc=upstream_proc)
    router_url = f"http://127.0.0.1:{router_port}"
    wait_ready(router_url, timeout=60, proc=router_proc)
    model = "bench"
    shapes: dict[str, bool] = {}
    differences: dict[str, dict[str, Any]] = {}
    if scenario == "worker":
        import httpx

        model = httpx.get(f"{upstream_url}/v1/models", timeout=10, trust_env=False).json()["data"][0]["id"]
        shapes, differences = compare_shapes(
            direct=upstream_url,
            routed=router_url,
            chat=lambda stream: chat_body(model=model, max_tokens=args.max_tokens, stream=stream),
            realtime_event=REALTIME_EVENT if args.ws_concurrency else None,
        )
        print(f"  responses through the router match direct ones in shape: {shapes}")
        for case, both in differences.items():
            print(
                f"  {case} differs: direct {str(both['direct'])[:300]} / routed {str(both['routed'])[:300]}"
            )
    upstream_pid = upstream_proc.pid if upstream_proc else report.pid_listening_on(port)
    pids = {"router": router_proc.pid, **({"upstream": upstream_pid} if upstream_pid else {})}
    direct_loads = scenario_loads(scenario, host=host, port=port, model=model, args=args)
    routed_loads = scenario_loads(scenario, host="127.0.0.1", port=router_port, model=model, args=args)
    results: list[Measurement] = []

    def gc_now() -> dict[str, tuple[int, float]]:
        return {
            "upstream": full_collections(upstream_url, "omni"),
            "router": full_collections(router_url, "omni_router"),
        }

    gc_before = gc_now()
    for (case, direct), (_, routed) in zip(direct_loads, routed_loads, strict=True):
        print(f"  {scenario} {case} x{direct.concurrency}: ", end="", flush=True)
        results += measure(
            runner,
            scenario=scenario,
            case=case,
            direct=direct,
            routed=routed,
            seconds=args.seconds,
            rounds=args.rounds,
            pids=pids,
            router_url=router_url,
        )
        print()
    gc_after = gc_now()
    gc_pauses = {
        name: {
            "full_collections": gc_after[name][0] - gc_before[name][0],
            "seconds": round(gc_after[name][1] - gc_before[name][1], 4),
        }
        for name in gc_before
    }
    print(
        "  full garbage collections during the loads: "
        + ", ".join(
            f"{name} {v['full_collections']} ({v['seconds'] * 1000:.0f} ms)" for name, v in gc_pauses.items()
        )
    )
    for proc in (router_proc, upstream_proc):
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    return results, {
        "upstream": description,
        "shapes_match": shapes,
        "shape_differences": differences,
        "gc_pauses": gc_pauses,
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    scenarios = [name.strip() for name in args.upstream.split(",") if name.strip()]
    unknown = sorted(set(scenarios) - {"echo", "worker"})
    if unknown or not scenarios:
        print(
            f"bench: error: --upstream: expected echo and/or worker, got {args.upstream!r}", file=sys.stderr
        )
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="omni-router-bench-"))
    hardware = report.hardware()
    procs: list[subprocess.Popen[bytes]] = []
    runner = LoadRunner(args.client_processes)
    results: list[Measurement] = []
    described: dict[str, Any] = {}
    print(
        f"router overhead: {args.rounds} rounds x {args.seconds:g} s per load (median round's throughput, latencies over all rounds); logs in {work}"
    )
    try:
        for scenario in scenarios:
            measured, described[scenario] = _run_scenario(scenario, args, work, runner, procs)
            results += measured
    finally:
        runner.close()
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
    print(report.table(results))
    print(
        "router CPU / upstr CPU: CPU time per request or message of the router (routed) and upstream (direct)"
    )
    print(
        f"hardware: {hardware['cpus']} CPUs ({hardware['processor']}), load average {hardware['load_average_before']}"
    )
    payload = {
        "scenarios": described,
        "hardware": hardware,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "client_processes": args.client_processes,
        "router_args": args.router_arg,
        "results": [asdict(m) for m in results],
    }
    (out / "results.json").write_text(json.dumps(payload, indent=2))
    title = (
        f"omni router overhead: direct vs through the router ({', '.join(scenarios)})\n"
        f"{hardware['cpus']} CPUs ({hardware['processor']})"
    )
    report.plot(results, out / "router_overhead.png", title)
    print(f"wrote {out / 'results.json'} and {out / 'router_overhead.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
