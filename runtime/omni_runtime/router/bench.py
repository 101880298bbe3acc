"""Router overhead benchmark: the same load straight to a worker and through `omni router`, in one run.

    python -m omni_runtime.router.bench --out DIR [--upstream-delay-ms 0] [--worker-url URL]
        [--seconds 3] [--rounds 3] [--concurrency 1,64] [--ws-concurrency 8]

By default it starts a minimal upstream (raw ASGI on uvicorn: a small chat-completion JSON and a
WebSocket echo), so the router's own cost is not hidden behind model time; `--upstream-delay-ms`
makes each answer wait (as a worker waiting on its accelerator does, without using this CPU), and
`--worker-url` measures a running worker instead (`omni serve`: one-token chat completions).
A real `omni router` runs in front, in its own process. A lean keep-alive HTTP/1.1 client measures
requests/s and latency percentiles at each concurrency, alternating direct and routed rounds so
background load hits both alike; a WebSocket ping-pong measures relayed messages/s. The CPU time
the router and the worker spend per request is read from /proc, a figure that does not depend on
what else the machine is doing. It prints a table and writes results.json and router_overhead.png
to --out. Quote the hardware line with the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ANSWER = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    }
).encode()
MESSAGES = [{"role": "user", "content": "hi"}]
_DELAY_S = 0.0  # set in the upstream process from --upstream-delay-ms


# ---- the built-in upstream: a worker with no model time on this CPU ---------------------------


async def upstream_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.accept"})
        while (message := await receive())["type"] == "websocket.receive":
            await send({"type": "websocket.send", "text": message.get("text"), "bytes": message.get("bytes")})
        return
    while (await receive()).get("more_body"):
        pass
    if scope["path"] == "/ready":
        body = b"{}"
    else:
        body = ANSWER
        if _DELAY_S:
            await asyncio.sleep(_DELAY_S)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def serve_upstream(port: int, delay_ms: float) -> None:
    import uvicorn

    global _DELAY_S
    _DELAY_S = delay_ms / 1000
    uvicorn.run(upstream_app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# ---- the load ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    request: bytes  # one complete HTTP/1.1 request, sent again and again on a keep-alive connection


@dataclass
class Measurement:
    target: str  # direct | router
    kind: str  # http | websocket
    concurrency: int
    per_second: float  # requests/s or round-trip messages/s
    p50_ms: float
    p99_ms: float
    count: int
    errors: int
    upstream_cpu_us: float  # CPU the worker process spent per request or message
    router_cpu_us: float  # CPU the router process spent per request or message (0 when direct)


def _request(host: str, port: int, body: bytes) -> bytes:
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _read_response(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    lowered = head.lower()
    at = lowered.find(b"content-length:")
    if at >= 0:
        await reader.readexactly(int(head[at + 15 : head.index(b"\r\n", at)]))
        return head
    while True:  # chunked
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        await reader.readexactly(size + 2)
        if size == 0:
            return head


async def _http_client(
    endpoint: Endpoint, deadline: float, latencies: list[float], errors: list[int]
) -> None:
    reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
    clock = time.perf_counter
    try:
        while clock() < deadline:
            started = clock()
            writer.write(endpoint.request)
            head = await _read_response(reader)
            latencies.append(clock() - started)
            if head[9:12] != b"200":
                errors.append(1)
    finally:
        writer.close()


async def _ws_client(endpoint: Endpoint, deadline: float, latencies: list[float]) -> None:
    from websockets.asyncio.client import connect

    url = f"ws://{endpoint.host}:{endpoint.port}/ws"
    async with connect(url, proxy=None, compression=None) as ws:
        payload = json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 256})
        clock = time.perf_counter
        while clock() < deadline:
            started = clock()
            await ws.send(payload)
            await ws.recv()
            latencies.append(clock() - started)


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _measure(
    *, target: str, kind: str, endpoint: Endpoint, concurrency: int, seconds: float, pids: dict[str, int]
) -> Measurement:
    cpu_before = {name: _cpu_seconds(pid) for name, pid in pids.items()}
    latencies: list[float] = []
    errors: list[int] = []
    started = time.perf_counter()
    deadline = started + seconds
    if kind == "http":
        await asyncio.gather(
            *(_http_client(endpoint, deadline, latencies, errors) for _ in range(concurrency))
        )
    else:
        await asyncio.gather(*(_ws_client(endpoint, deadline, latencies) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies) or [0.0]
    count = len(latencies)
    cpu_us = {
        name: (_cpu_seconds(pid) - cpu_before[name]) * 1e6 / max(1, count) for name, pid in pids.items()
    }
    return Measurement(
        target=target,
        kind=kind,
        concurrency=concurrency,
        per_second=count / elapsed,
        p50_ms=statistics.median(ordered) * 1000,
        p99_ms=ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        count=count,
        errors=len(errors),
        upstream_cpu_us=round(cpu_us.get("upstream", 0.0), 1),
        router_cpu_us=round(cpu_us.get("router", 0.0), 1) if target == "router" else 0.0,
    )


async def _run_all(
    *,
    direct: Endpoint,
    routed: Endpoint,
    loads: list[tuple[str, int]],
    seconds: float,
    rounds: int,
    pids: dict[str, int],
) -> list[Measurement]:
    results: list[Measurement] = []
    for kind, level in loads:
        print(f"  {kind} x{level}: ", end="", flush=True)
        for endpoint in (routed, direct):  # warm connections, pools and caches on both paths
            await _measure(
                target="warmup", kind=kind, endpoint=endpoint, concurrency=level, seconds=0.5, pids={}
            )
        by_target: dict[str, list[Measurement]] = {"direct": [], "router": []}
        for _ in range(rounds):  # alternate, so background load falls on both alike
            for target, endpoint in (("direct", direct), ("router", routed)):
                measured = await _measure(
                    target=target, kind=kind, endpoint=endpoint, concurrency=level, seconds=seconds, pids=pids
                )
                by_target[target].append(measured)
                print(".", end="", flush=True)
        print()
        # The round with the median throughput: one real round, not a blend of several.
        for target in ("direct", "router"):
            rounds_ = sorted(by_target[target], key=lambda m: m.per_second)
            results.append(rounds_[len(rounds_) // 2])
    return results


# ---- processes and report ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(base_url: str, timeout: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base_url}/ready", timeout=1.0, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"bench: {base_url}/ready did not answer 200 within {timeout:g} s")


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def _pid_listening_on(port: int) -> int | None:
    """The pid of a local process listening on a port (Linux /proc), to count a given worker's CPU."""
    try:
        lines = (
            Path("/proc/net/tcp").read_text().splitlines()[1:]
            + Path("/proc/net/tcp6").read_text().splitlines()[1:]
        )
    except OSError:
        return None
    inodes = set()
    for line in lines:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
            inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                return int(proc.name)
        except OSError:  # a process that ended or that we may not inspect
            continue
    return None


def _table(results: list[Measurement]) -> str:
    lines = [
        f"{'load':<16}{'direct /s':>11}{'router /s':>11}{'loss':>8}{'p99 direct':>12}{'p99 router':>12}"
        f"{'added p99':>11}{'router CPU':>12}{'worker CPU':>12}"
    ]
    for kind, concurrency in sorted({(m.kind, m.concurrency) for m in results}):
        pair = {m.target: m for m in results if (m.kind, m.concurrency) == (kind, concurrency)}
        direct, routed = pair["direct"], pair["router"]
        loss = 1 - routed.per_second / direct.per_second if direct.per_second else 0.0
        label = f"{'HTTP' if kind == 'http' else 'WS msgs'} x{concurrency}"
        lines.append(
            f"{label:<16}{direct.per_second:>11.0f}{routed.per_second:>11.0f}{loss:>8.1%}"
            f"{direct.p99_ms:>10.2f}ms{routed.p99_ms:>10.2f}ms{routed.p99_ms - direct.p99_ms:>9.2f}ms"
            f"{routed.router_cpu_us:>10.0f}us{direct.upstream_cpu_us:>10.0f}us"
        )
    return "\n".join(lines)


def _plot(results: list[Measurement], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({(m.kind, m.concurrency) for m in results})
    labels = [f"{'HTTP' if kind == 'http' else 'WS'} x{c}" for kind, c in keys]
    get = {(m.target, m.kind, m.concurrency): m for m in results}
    figure, (rate_axis, p99_axis) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.38
    for offset, target in ((-width / 2, "direct"), (width / 2, "router")):
        xs = [index + offset for index in range(len(keys))]
        rate_axis.bar(xs, [get[(target, k, c)].per_second for k, c in keys], width, label=target)
        p99_axis.bar(xs, [get[(target, k, c)].p99_ms for k, c in keys], width, label=target)
    rate_axis.set_yscale("log")  # WebSocket messages and single-client requests differ by orders of magnitude
    for axis, ylabel in ((rate_axis, "requests or messages per second"), (p99_axis, "p99 latency (ms)")):
        axis.set_xticks(range(len(keys)), labels)
        axis.set_ylabel(ylabel)
        axis.legend()
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m omni_runtime.router.bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", required=True, help="folder for results.json and router_overhead.png")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one measured round (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per load; the median round is reported")
    parser.add_argument("--concurrency", default="1,64", help="HTTP client counts, comma list (default 1,64)")
    parser.add_argument(
        "--ws-concurrency", type=int, default=8, help="WebSocket connections; 0 skips (default 8)"
    )
    parser.add_argument(
        "--upstream-delay-ms", type=float, default=0.0, help="built-in upstream: wait per answer"
    )
    parser.add_argument(
        "--worker-url", help="measure this running worker (omni serve) instead of the built-in one"
    )
    parser.add_argument(
        "--router-arg", action="append", default=[], help="extra `omni router` flag (repeatable)"
    )
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)  # internal: run the upstream
    args = parser.parse_args(argv)
    if args.serve_upstream:
        serve_upstream(args.serve_upstream, args.upstream_delay_ms)
        return 0

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="omni-router-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    if args.worker_url:
        worker_url = args.worker_url.rstrip("/")
        parts = urlsplit(worker_url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        scenario = f"worker {worker_url}: one-token chat completions"
    else:
        host, port = "127.0.0.1", _free_port()
        worker_url = f"http://{host}:{port}"
        upstream_argv = [sys.executable, "-m", "omni_runtime.router.bench", "--out", str(out)]
        upstream_argv += ["--serve-upstream", str(port), "--upstream-delay-ms", str(args.upstream_delay_ms)]
        procs.append(_start(upstream_argv, work / "upstream.log"))
        scenario = f"built-in upstream, {args.upstream_delay_ms:g} ms per answer"
    router_port = _free_port()
    workers = work / "workers.json"
    entry = {"id": "bench-w0", "url": worker_url, "revision": "bench", "state": "ready"}
    workers.write_text(json.dumps({"workers": [entry]}))
    router_argv = [sys.executable, "-m", "omni_runtime.router.main", "--host", "127.0.0.1"]
    router_argv += ["--port", str(router_port), "--workers-file", str(workers), *args.router_arg]
    procs.append(_start(router_argv, work / "router.log"))
    try:
        _wait_ready(worker_url)
        _wait_ready(f"http://127.0.0.1:{router_port}")
        body: dict[str, Any] = {"model": "bench", "messages": MESSAGES}
        if args.worker_url:
            import httpx

            models = httpx.get(f"{worker_url}/v1/models", timeout=10, trust_env=False).json()
            body = {"model": models["data"][0]["id"], "messages": MESSAGES, "max_tokens": 1}
        payload = json.dumps(body).encode()
        direct = Endpoint(host, port, _request(host, port, payload))
        routed = Endpoint("127.0.0.1", router_port, _request("127.0.0.1", router_port, payload))
        loads = [("http", int(c)) for c in args.concurrency.split(",")]
        if args.ws_concurrency and not args.worker_url:
            loads.append(("websocket", args.ws_concurrency))
        worker_pid = procs[0].pid if not args.worker_url else _pid_listening_on(port)
        pids = {"router": procs[-1].pid, **({"upstream": worker_pid} if worker_pid else {})}
        load_before = os.getloadavg()
        print(
            f"router overhead, {scenario}: {args.rounds} rounds x {args.seconds:g} s per load, median round"
        )
        results = asyncio.run(
            _run_all(
                direct=direct, routed=routed, loads=loads, seconds=args.seconds, rounds=args.rounds, pids=pids
            )
        )
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=15)
    hardware = {
        "cpus": os.cpu_count(),
        "processor": _cpu_model(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "load_average_before": [round(value, 2) for value in load_before],
    }
    print(_table(results))
    print(
        "router CPU / worker CPU: CPU time per request or message of the router (routed) and worker (direct)"
    )
    print(
        f"hardware: {hardware['cpus']} CPUs ({hardware['processor']}), load average {hardware['load_average_before']}"
    )
    report = {
        "scenario": scenario,
        "hardware": hardware,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "router_args": args.router_arg,
        "results": [asdict(m) for m in results],
    }
    (out / "results.json").write_text(json.dumps(report, indent=2))
    title = (
        f"omni router overhead: {scenario}\n{hardware['cpus']} CPUs ({hardware['processor']}), "
        f"load average {load_before[0]:.2f}"
    )
    _plot(results, out / "router_overhead.png", title)
    print(f"wrote {out / 'results.json'} and {out / 'router_overhead.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
