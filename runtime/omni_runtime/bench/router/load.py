"""Load generators for the router benchmark: lean keep-alive HTTP/1.1 clients and WebSocket clients.

The client must cost less than what it measures, so HTTP goes over raw asyncio streams with one
prebuilt request sent again and again on each keep-alive connection (no client library), parsing
only what is needed to find the end of an answer. Streaming answers (SSE over chunked encoding) are
read chunk by chunk and the time to the first chunk is kept. WebSockets use the `websockets` client:
a ping-pong that sends one message and waits for its answer. A load can be split over several
client processes (`processes`), each running its share of the connections on its own event loop
(uvloop when installed), so a many-core host can push a router harder than one Python process can.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from multiprocessing import get_context


@dataclass(frozen=True)
class Load:
    """One load against one endpoint: what each connection sends and how its answer ends."""

    kind: str  # http (whole answers) | sse (chunked streams; time to first chunk kept) | ws
    host: str
    port: int
    concurrency: int
    request: bytes = b""  # http/sse: one complete HTTP/1.1 request
    ws_path: str = "/ws"  # ws: the path to connect to
    ws_message: str = ""  # ws: sent for each round trip
    ws_reply_type: str | None = None  # ws: wait for an event of this "type" (None: any message answers)
    ws_ready_type: str | None = None  # ws: an event to wait for after connecting (session.created)


@dataclass
class Sample:
    """What the connections of one load measured: latencies in seconds."""

    latencies: list[float] = field(default_factory=list)
    first_chunk: list[float] = field(default_factory=list)
    errors: int = 0
    elapsed: float = 0.0

    def merge(self, other: Sample) -> None:
        self.latencies += other.latencies
        self.first_chunk += other.first_chunk
        self.errors += other.errors
        self.elapsed = max(self.elapsed, other.elapsed)


def percentile_ms(values: list[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    if fraction == 0.5:
        return statistics.median(ordered) * 1000
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] * 1000


def http_request(
    *, host: str, port: int, path: str, body: bytes, headers: dict[str, str] | None = None
) -> bytes:
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n{extra}"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _read_answer(reader: asyncio.StreamReader, on_first_chunk: list[float] | None) -> bytes:
    """Read one whole answer; return its head. For a chunked one, note when the first chunk came."""
    head = await reader.readuntil(b"\r\n\r\n")
    lowered = head.lower()
    at = lowered.find(b"content-length:")
    if at >= 0:
        await reader.readexactly(int(head[at + 15 : head.index(b"\r\n", at)]))
        return head
    first = True
    while True:  # chunked
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        await reader.readexactly(size + 2)
        if first and size and on_first_chunk is not None:
            on_first_chunk.append(time.perf_counter())
            first = False
        if size == 0:
            return head


async def _http_connection(load: Load, start: float, deadline: float, sample: Sample) -> None:
    clock = time.perf_counter
    first_chunks: list[float] | None = [] if load.kind == "sse" else None
    reader, writer = await asyncio.open_connection(load.host, load.port)
    await asyncio.sleep(max(0.0, start - clock()))
    try:
        while clock() < deadline:
            started = clock()
            try:
                writer.write(load.request)
                head = await _read_answer(reader, first_chunks)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                sample.errors += 1  # the server closed the connection: count it and open another
                writer.close()
                reader, writer = await asyncio.open_connection(load.host, load.port)
                continue
            sample.latencies.append(clock() - started)
            if first_chunks:
                sample.first_chunk.append(first_chunks.pop() - started)
            if head[9:12] != b"200":
                sample.errors += 1
    finally:
        writer.close()


async def _ws_connection(load: Load, start: float, deadline: float, sample: Sample) -> None:
    from websockets.asyncio.client import connect

    clock = time.perf_counter
    url = f"ws://{load.host}:{load.port}{load.ws_path}"
    async with connect(url, proxy=None, compression=None, max_size=None) as ws:
        if load.ws_ready_type is not None:
            while json.loads(await ws.recv()).get("type") != load.ws_ready_type:
                pass
        await asyncio.sleep(max(0.0, start - clock()))
        while clock() < deadline:
            started = clock()
            await ws.send(load.ws_message)
            while True:
                reply = await ws.recv()
                if load.ws_reply_type is None:
                    break
                kind = json.loads(reply).get("type")
                if kind == load.ws_reply_type:
                    break
                if kind == "error":
                    sample.errors += 1
                    break
            sample.latencies.append(clock() - started)


async def _run(load: Load, seconds: float) -> Sample:
    """Open every connection, then load for `seconds` from a common start."""
    sample = Sample()
    start = time.perf_counter() + 0.2 + load.concurrency * 0.002  # time for every connection to open
    deadline = start + seconds
    one = _ws_connection if load.kind == "ws" else _http_connection
    results = await asyncio.gather(
        *(one(load, start, deadline, sample) for _ in range(load.concurrency)), return_exceptions=True
    )
    sample.errors += sum(1 for result in results if isinstance(result, BaseException))
    sample.elapsed = time.perf_counter() - start
    return sample


def run_load(load: Load, seconds: float) -> Sample:
    """Run one load on this process's own event loop (uvloop when installed)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_run(load, seconds))
    return uvloop.run(_run(load, seconds))


class LoadRunner:
    """Runs loads in this process, or split over `processes` client processes started once."""

    def __init__(self, processes: int = 1) -> None:
        self.processes = max(1, processes)
        self._pool: ProcessPoolExecutor | None = None
        if self.processes > 1:
            # spawn, not fork: the parent may hold threads (subprocess pipes, the HTTP checks).
            self._pool = ProcessPoolExecutor(self.processes, mp_context=get_context("spawn"))

    def run(self, load: Load, seconds: float) -> Sample:
        if self._pool is None or load.concurrency < 2:
            return run_load(load, seconds)
        shares = [load.concurrency // self.processes] * self.processes
        for index in range(load.concurrency % self.processes):
            shares[index] += 1
        futures = [
            self._pool.submit(run_load, replace(load, concurrency=share), seconds)
            for share in shares
            if share
        ]
        total = Sample()
        for future in futures:
            total.merge(future.result())
        return total

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
