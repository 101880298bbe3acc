"""The router benchmark's results: one record per measured load, a text table, a plot, the hardware.

Rows pair a direct measurement with the same load through the router; `scenario` says what stood
behind (the 0 ms echo upstream, the worst case for a proxy, or a real `omni serve` worker), `case`
what was sent (chat completions whole or streamed, WebSocket round trips).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

CASE_LABELS = {
    "chat": "chat",
    "chat_stream": "chat SSE",
    "ws_echo": "WS msgs",
    "ws_realtime": "realtime WS msgs",
}


@dataclass
class Measurement:
    scenario: str  # echo | worker
    case: str  # chat | chat_stream | ws_echo | ws_realtime
    target: str  # direct | router
    concurrency: int
    per_second: float  # requests/s, or round-trip messages/s for WebSockets
    p50_ms: float
    p99_ms: float
    first_chunk_p50_ms: float  # streamed answers: time to the first chunk (0 otherwise)
    first_chunk_p99_ms: float
    count: int
    errors: int
    upstream_cpu_us: float  # CPU the upstream process spent per request or message
    router_cpu_us: float  # CPU the router process(es) spent per request or message (0 when direct)
    # HTTP through the router: p99 of the router's own time per request (its overhead histogram,
    # so the upper bound of the bucket holding the 99th percentile); 0 when direct or not known.
    router_own_p99_ms: float = 0.0

    def key(self) -> tuple[str, str, int]:
        return (self.scenario, self.case, self.concurrency)

    def label(self) -> str:
        return f"{self.scenario} {CASE_LABELS.get(self.case, self.case)} x{self.concurrency}"


def pairs(results: list[Measurement]) -> list[tuple[Measurement, Measurement]]:
    """(direct, router) for every measured load, in the order they were measured."""
    by_key: dict[tuple[str, str, int], dict[str, Measurement]] = {}
    for measurement in results:
        by_key.setdefault(measurement.key(), {})[measurement.target] = measurement
    return [(pair["direct"], pair["router"]) for pair in by_key.values() if len(pair) == 2]


def loss(direct: Measurement, routed: Measurement) -> float:
    return 1 - routed.per_second / direct.per_second if direct.per_second else 0.0


def histogram_quantile(buckets: dict[float, float], before: dict[float, float], q: float) -> float:
    """Upper bound of the bucket holding quantile q of the observations between two scrapes of one
    cumulative Prometheus histogram ({le: count}, +Inf as math.inf); 0 when nothing was observed."""
    bounds = sorted(buckets)
    counts = [buckets[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return 0.0
    wanted = q * counts[-1]
    return next(b for b, c in zip(bounds, counts, strict=True) if c >= wanted)


def table(results: list[Measurement]) -> str:
    lines = [
        f"{'load':<30}{'direct /s':>10}{'router /s':>10}{'loss':>8}{'p99 direct':>12}{'p99 router':>12}"
        f"{'added p99':>11}{'own p99':>9}{'TTFC p99 d/r':>16}{'router CPU':>12}{'upstr CPU':>11}{'err':>5}"
    ]
    for direct, routed in pairs(results):
        ttfc = (
            f"{direct.first_chunk_p99_ms:.1f}/{routed.first_chunk_p99_ms:.1f}ms"
            if direct.case == "chat_stream"
            else "-"
        )
        own = f"≤{routed.router_own_p99_ms:g}ms" if routed.router_own_p99_ms else "-"
        lines.append(
            f"{direct.label():<30}{direct.per_second:>10.0f}{routed.per_second:>10.0f}"
            f"{loss(direct, routed):>8.1%}{direct.p99_ms:>10.2f}ms{routed.p99_ms:>10.2f}ms"
            f"{routed.p99_ms - direct.p99_ms:>9.2f}ms{own:>9}{ttfc:>16}{routed.router_cpu_us:>10.0f}us"
            f"{direct.upstream_cpu_us:>9.0f}us{direct.errors + routed.errors:>5}"
        )
    return "\n".join(lines)


def plot(results: list[Measurement], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = pairs(results)
    labels = [direct.label().replace(" x", "\nx") for direct, _ in rows]
    figure, (rate_axis, p99_axis) = plt.subplots(1, 2, figsize=(max(11, 1.3 * len(rows) * 2), 4.5))
    width = 0.38
    for offset, index, name in ((-width / 2, 0, "direct"), (width / 2, 1, "router")):
        xs = [position + offset for position in range(len(rows))]
        rate_axis.bar(xs, [row[index].per_second for row in rows], width, label=name)
        p99_axis.bar(xs, [row[index].p99_ms for row in rows], width, label=name)
    rate_axis.set_yscale("log")  # echo, model-bound and WebSocket rates differ by orders of magnitude
    p99_axis.set_yscale("log")
    for axis, ylabel in ((rate_axis, "requests or messages per second"), (p99_axis, "p99 latency (ms)")):
        axis.set_xticks(range(len(rows)), labels, fontsize=7)
        axis.set_ylabel(ylabel)
        axis.legend()
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def hardware() -> dict[str, object]:
    return {
        "cpus": os.cpu_count(),
        "processor": cpu_model(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "load_average_before": [round(value, 2) for value in os.getloadavg()],
    }


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process and its children (Linux /proc; 0 elsewhere)."""
    total = 0.0
    for one in (pid, *children(pid)):
        try:
            fields = Path(f"/proc/{one}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def children(pid: int) -> list[int]:
    """Direct child processes (a router with --processes runs its replicas as children)."""
    try:
        found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(child) for child in found]


def pid_listening_on(port: int) -> int | None:
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
