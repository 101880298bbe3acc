"""Router overhead benchmark: the same load straight to a worker and through `omni router`, in one run.

    python -m omni_runtime.router.bench --out bench-out/ [--seconds 3] [--rounds 3] [--concurrency 1,64]

It starts a minimal upstream (raw ASGI on uvicorn: a small JSON answer and a WebSocket echo, so the
router's own cost is not hidden behind model time) and a real `omni router` in front of it, each
its own process. A lean keep-alive HTTP/1.1 client measures requests/s and latency percentiles at
each concurrency, alternating direct and routed rounds so background load hits both alike, and a
WebSocket ping-pong measures relayed messages/s. It prints a table and writes results.json and
router_overhead.png to --out. Report the hardware with the numbers: they are CPU-bound.
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

ANSWER = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    }
).encode()
REQUEST = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "hi"}]}).encode()


# ---- the upstream: a worker with no model time ----------------------------------------------


async def upstream_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
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
    body = ANSWER if scope["path"] != "/ready" else b"{}"
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def serve_upstream(port: int) -> None:
    import uvicorn

    uvicorn.run(upstream_app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# ---- the load ---------------------------------------------------------------------------------


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
    upstream_cpu_us: float  # CPU the upstream process spent per request or message
    router_cpu_us: float  # CPU the router process spent per request or message (0 when direct)


async def _http_client(port: int, deadline: float, latencies: list[float], errors: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(REQUEST)}\r\n\r\n"
    ).encode() + REQUEST
    clock = time.perf_counter
    try:
        while clock() < deadline:
            started = clock()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            at = head.lower().find(b"content-length:")
            size = int(head[at + 15 : head.index(b"\r\n", at)])
            await reader.readexactly(size)
            latencies.append(clock() - started)
            if head[9:12] != b"200":
                errors.append(1)
    finally:
        writer.close()


async def _ws_client(port: int, deadline: float, latencies: list[float]) -> None:
    from websockets.asyncio.client import connect

    async with connect(f"ws://127.0.0.1:{port}/ws", proxy=None, compression=None) as ws:
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
    *, target: str, kind: str, port: int, concurrency: int, seconds: float, pids: dict[str, int] | None = None
) -> Measurement:
    pids = pids or {}
    cpu_before = {name: _cpu_seconds(pid) for name, pid in pids.items()}
    latencies: list[float] = []
    errors: list[int] = []
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    if kind == "http":
        await asyncio.gather(*(_http_client(port, deadline, latencies, errors) for _ in range(concurrency)))
    else:
        await asyncio.gather(*(_ws_client(port, deadline, latencies) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    cpu_us = {
        name: (_cpu_seconds(pid) - cpu_before[name]) * 1e6 / max(1, len(ordered))
        for name, pid in pids.items()
    }
    return Measurement(
        target=target,
        kind=kind,
        concurrency=concurrency,
        per_second=len(ordered) / elapsed,
        p50_ms=statistics.median(ordered) * 1000,
        p99_ms=ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        count=len(ordered),
        errors=len(errors),
        upstream_cpu_us=round(cpu_us.get("upstream", 0.0), 1),
        router_cpu_us=round(cpu_us.get("router", 0.0), 1) if target == "router" else 0.0,
    )


def _median_of(rounds: list[Measurement]) -> Measurement:
    """The round with the median throughput: one real round, not a blend of several."""
    return sorted(rounds, key=lambda m: m.per_second)[len(rounds) // 2]


# ---- processes --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(port: int, path: str, timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}{path}", timeout=1.0, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"nothing ready on port {port}{path} after {timeout} s")


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


# ---- report -----------------------------------------------------------------------------------


def _table(results: list[Measurement]) -> str:
    lines = [
        f"{'load':<18}{'direct /s':>11}{'router /s':>11}{'loss':>8}{'p99 direct':>12}{'p99 router':>12}"
        f"{'added p99':>11}{'router CPU':>12}{'worker CPU':>12}"
    ]
    keys = sorted({(m.kind, m.concurrency) for m in results})
    for kind, concurrency in keys:
        pair = {m.target: m for m in results if (m.kind, m.concurrency) == (kind, concurrency)}
        direct, routed = pair["direct"], pair["router"]
        loss = 1 - routed.per_second / direct.per_second
        label = f"{'HTTP' if kind == 'http' else 'WS messages'} x{concurrency}"
        lines.append(
            f"{label:<18}{direct.per_second:>11.0f}{routed.per_second:>11.0f}{loss:>8.1%}"
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
    for axis, ylabel in ((rate_axis, "requests or messages per second"), (p99_axis, "p99 latency (ms)")):
        axis.set_xticks(range(len(keys)), labels)
        axis.set_ylabel(ylabel)
        axis.legend()
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


# ---- main -------------------------------------------------------------------------------------


async def _run_all(
    *,
    upstream: int,
    router: int,
    concurrency: list[int],
    ws_concurrency: int,
    seconds: float,
    rounds: int,
    pids: dict[str, int],
) -> list[Measurement]:
    results: list[Measurement] = []
    loads = [("http", c) for c in concurrency] + [("websocket", ws_concurrency)]
    for kind, level in loads:
        print(f"  {kind} x{level}: ", end="", flush=True)
        await _measure(target="warmup", kind=kind, port=router, concurrency=level, seconds=0.5)
        await _measure(target="warmup", kind=kind, port=upstream, concurrency=level, seconds=0.5)
        by_target: dict[str, list[Measurement]] = {"direct": [], "router": []}
        for _ in range(rounds):  # alternate, so background load falls on both alike
            for target, port in (("direct", upstream), ("router", router)):
                by_target[target].append(
                    await _measure(
                        target=target, kind=kind, port=port, concurrency=level, seconds=seconds, pids=pids
                    )
                )
                print(".", end="", flush=True)
        print()
        results += [_median_of(by_target["direct"]), _median_of(by_target["router"])]
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m omni_runtime.router.bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", required=True, help="folder for results.json and router_overhead.png")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one measured round (default 3)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds per load; the median is reported (default 3)"
    )
    parser.add_argument("--concurrency", default="1,64", help="HTTP client counts, comma list (default 1,64)")
    parser.add_argument("--ws-concurrency", type=int, default=8, help="WebSocket connections (default 8)")
    parser.add_argument(
        "--router-arg", action="append", default=[], help="extra `omni router` flag (repeatable)"
    )
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)  # internal: run the upstream
    args = parser.parse_args(argv)
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    concurrency = [int(part) for part in args.concurrency.split(",")]
    work = Path(tempfile.mkdtemp(prefix="omni-router-bench-"))
    upstream_port, router_port = _free_port(), _free_port()
    workers = work / "workers.json"
    workers.write_text(
        json.dumps(
            {
                "workers": [
                    {
                        "id": "bench-w0",
                        "url": f"http://127.0.0.1:{upstream_port}",
                        "revision": "bench",
                        "state": "ready",
                    }
                ]
            }
        )
    )
    procs = [
        _start(
            [
                sys.executable,
                "-m",
                "omni_runtime.router.bench",
                "--out",
                str(out),
                "--serve-upstream",
                str(upstream_port),
            ],
            work / "upstream.log",
        ),
        _start(
            [
                sys.executable,
                "-m",
                "omni_runtime.router.main",
                "--host",
                "127.0.0.1",
                "--port",
                str(router_port),
                "--workers-file",
                str(workers),
                *args.router_arg,
            ],
            work / "router.log",
        ),
    ]
    try:
        _wait_ready(upstream_port, "/ready")
        _wait_ready(router_port, "/ready")
        load_before = os.getloadavg()
        print(f"router overhead: {args.rounds} rounds x {args.seconds:g} s per load, median round reported")
        results = asyncio.run(
            _run_all(
                upstream=upstream_port,
                router=router_port,
                concurrency=concurrency,
                ws_concurrency=args.ws_concurrency,
                pids={"upstream": procs[0].pid, "router": procs[1].pid},
                seconds=args.seconds,
                rounds=args.rounds,
            )
        )
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=15)
    hardware = {
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "processor": _cpu_model(),
        "python": platform.python_version(),
        "load_average_before": [round(value, 2) for value in load_before],
        "router_args": args.router_arg,
    }
    table = _table(results)
    print(table)
    print("router CPU and worker CPU: CPU time per request or message (router path, direct path)")
    print(
        f"hardware: {hardware['cpus']} CPUs ({hardware['processor']}), load average {hardware['load_average_before']}"
    )
    (out / "results.json").write_text(
        json.dumps(
            {
                "hardware": hardware,
                "seconds": args.seconds,
                "rounds": args.rounds,
                "results": [asdict(m) for m in results],
            },
            indent=2,
        )
    )
    title = (
        f"omni router overhead, 1 upstream, {hardware['cpus']} CPUs ({hardware['processor']}), "
        f"load avg {hardware['load_average_before'][0]}"
    )
    _plot(results, out / "router_overhead.png", title)
    print(f"wrote {out / 'results.json'} and {out / 'router_overhead.png'}")
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
