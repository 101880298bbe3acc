"""A lean HTTP/1.1 client for the router's hot path: keep-alive pools per worker, streamed bodies.

Why not httpx here: measured on the benchmark box, an httpx (httpcore + anyio + h11) request cost
350-600 us of CPU, ten times a bare asyncio connection, and made the router several times more
expensive than the worker it fronts. This client does only what a reverse proxy needs: send a
request head and a body (whole or chunked), parse the answer with httptools (the parser uvicorn
already uses), hand the body over chunk by chunk as it arrives, and reuse the connection when the
answer was complete and keep-alive. httpx still serves the low-rate health checks.

Failures are typed so the proxy can decide on retries: `ConnectFailed` and `ConnectionLost` before
any response byte mean the worker never answered (`started` is False); a reused keep-alive
connection that the worker had just closed is retried here once on a fresh connection, so an idle
timeout on the worker never reaches the client or takes a healthy worker out of rotation.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator
from typing import cast
from urllib.parse import urlsplit

import httptools

Headers = list[tuple[bytes, bytes]]

IDLE_EXPIRY_S = 4.0  # below uvicorn's default 5 s keep-alive: we drop a connection before the worker does
MAX_IDLE_PER_WORKER = 256
PAUSE_BYTES = 1024 * 1024  # stop reading from a worker while this much body waits for the client


class UpstreamError(Exception):
    """The worker could not be asked or did not answer properly."""

    started = True  # whether the worker may have begun on the request


class ConnectFailed(UpstreamError):
    started = False


class ConnectionLost(UpstreamError):
    def __init__(self, message: str, *, started: bool) -> None:
        super().__init__(message)
        self.started = started


class UpstreamTimeout(UpstreamError):
    pass


class ProtocolFailure(UpstreamError):
    pass


class _Connection(asyncio.Protocol):
    """One keep-alive connection to a worker, carrying one request at a time."""

    def __init__(self, pool_key: tuple[str, int]) -> None:
        self.pool_key = pool_key
        self.host_header = f"{pool_key[0]}:{pool_key[1]}".encode()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._can_write = asyncio.Event()
        self._can_write.set()
        # One parser for the connection's life: it resets itself after each complete answer, and a
        # connection is only reused after a complete one.
        self.parser = httptools.HttpResponseParser(self)
        self.begin(head_only=False)

    def begin(self, *, head_only: bool) -> None:
        """Fresh state for the next request on this connection."""
        self.head_only = head_only
        self.status = 0
        self.headers: Headers = []
        self.headers_done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.complete = False
        self.completed_at = 0.0
        self.received_any = False
        self.error: UpstreamError | None = None
        self.wakeup = asyncio.Event()
        self.paused = False
        self.length_known = False
        self.keep_alive = False
        self.upload: asyncio.Future[None] | None = None  # a streamed request body still being sent

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ProtocolFailure(f"bad HTTP from worker: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._can_write.set()
        if self.complete or self.error is not None:
            return
        if self.headers_done.done() and not self.length_known:
            self.complete = True  # a body delimited by the end of the connection
            self.completed_at = time.perf_counter()
            self.wakeup.set()
            return
        self._fail(ConnectionLost("worker closed the connection", started=self.received_any))

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered in (b"content-length", b"transfer-encoding"):
            self.length_known = True
        self.headers.append((lowered, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if 100 <= self.status < 200:  # an interim answer (100 Continue): the real one follows
            self.headers = []
            return
        # Asked now: after the message completes, the parser has reset and no longer knows.
        self.keep_alive = self.parser.should_keep_alive()
        if not self.headers_done.done():
            self.headers_done.set_result(None)
        if self.head_only:  # the answer to HEAD has no body whatever its headers say
            self.complete = True
            self.completed_at = time.perf_counter()
            self.wakeup.set()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > PAUSE_BYTES and not self.paused and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True
        self.wakeup.set()

    def on_message_complete(self) -> None:
        if 100 <= self.status < 200:
            return
        self.complete = True
        self.completed_at = time.perf_counter()  # the router's own time is measured against this
        self.wakeup.set()

    def _fail(self, error: UpstreamError) -> None:
        self.error = error
        if not self.headers_done.done():
            self.headers_done.set_exception(error)
            self.headers_done.exception()  # retrieved: the waiter may already be gone
        self.wakeup.set()
        if self.transport is not None:
            self.transport.close()

    def upload_done(self, upload: asyncio.Future[None]) -> None:
        """A streamed request body ended; if it failed before the answer began, so does the request."""
        error = None if upload.cancelled() else upload.exception()
        if error is None:
            return
        if not self.headers_done.done():
            self.headers_done.set_exception(error)  # the caller sees the body's own failure
        if self.transport is not None:
            self.transport.close()

    def time_out(self) -> None:
        """Called by a timer: the worker stayed silent too long; fail whatever waits and close."""
        if not self.complete and self.error is None:
            self._fail(UpstreamTimeout("the worker sent nothing within --upstream-timeout"))

    def reusable(self) -> bool:
        return (
            self.complete
            and (self.upload is None or (self.upload.done() and not self.upload.cancelled()))
            and not self.head_only  # the parser may still expect the body HEAD's headers announce
            and not self.closed
            and self.error is None
            and self.keep_alive
        )


class UpstreamResponse:
    def __init__(self, pool: UpstreamPool, connection: _Connection, *, read_timeout: float) -> None:
        self._pool = pool
        self._connection = connection
        self._read_timeout = read_timeout
        self.status = connection.status
        self.headers = connection.headers
        self.upload = connection.upload  # the request body still streaming to the worker, if any
        self._released = False

    def upload_failed(self) -> bool:
        """Whether the client's streamed body failed (too large, client gone): not the worker's fault."""
        upload = self.upload
        return (
            upload is not None and upload.done() and not upload.cancelled() and upload.exception() is not None
        )

    @property
    def completed_at(self) -> float:
        """perf_counter() when the worker's answer was all received (0 while it is not)."""
        return self._connection.completed_at

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        connection = self._connection
        while True:
            if connection.chunks:
                chunk = connection.chunks.popleft()
                connection.buffered -= len(chunk)
                if connection.paused and connection.buffered < PAUSE_BYTES // 2 and connection.transport:
                    connection.transport.resume_reading()
                    connection.paused = False
                yield chunk
                continue
            if connection.complete:
                return
            if connection.error is not None:
                raise connection.error
            connection.wakeup.clear()
            # A timer rather than wait_for: no extra task per chunk on the streaming path.
            timer = asyncio.get_running_loop().call_later(self._read_timeout, connection.time_out)
            try:
                await connection.wakeup.wait()
            finally:
                timer.cancel()

    async def read(self) -> bytes:
        connection = self._connection
        if connection.complete and connection.error is None:  # all arrived with the head: no waiting
            data = b"".join(connection.chunks)
            connection.chunks.clear()
            connection.buffered = 0
            return data
        return b"".join([chunk async for chunk in self.iter_chunks()])

    def close(self) -> None:
        """Give the connection back when the answer was complete; otherwise close it."""
        if self._released:
            return
        self._released = True
        self._pool.release(self._connection)


async def _upload(connection: _Connection, body: AsyncIterator[bytes]) -> None:
    transport = connection.transport
    assert transport is not None
    async for chunk in body:
        if connection.closed:
            return
        if chunk:
            transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
            await connection._can_write.wait()
    transport.write(b"0\r\n\r\n")


class UpstreamPool:
    def __init__(self, *, connect_timeout: float, read_timeout: float) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: dict[tuple[str, int], collections.deque[_Connection]] = {}
        self._addresses: dict[str, tuple[str, int]] = {}

    def _address(self, base_url: str) -> tuple[str, int]:
        address = self._addresses.get(base_url)
        if address is None:
            parts = urlsplit(base_url)
            if parts.scheme != "http":
                raise ConnectFailed(f"{base_url}: only http:// workers are supported by the router's client")
            address = (parts.hostname or "127.0.0.1", parts.port or 80)
            self._addresses[base_url] = address
        return address

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(key), key[0], key[1]), self.connect_timeout
            )
        except TimeoutError:
            raise ConnectFailed(
                f"connect to {key[0]}:{key[1]} timed out after {self.connect_timeout:g} s"
            ) from None
        except OSError as exc:
            raise ConnectFailed(f"connect to {key[0]}:{key[1]} failed: {exc.strerror or exc}") from None
        return connection

    def _take_idle(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            connection = idle.pop()  # most recently used first: it is the least likely to have expired
            if not connection.closed and now - connection.idle_since < IDLE_EXPIRY_S:
                return connection
            if connection.transport is not None:
                connection.transport.close()
        return None

    def release(self, connection: _Connection) -> None:
        if connection.upload is not None and not connection.upload.done():
            connection.upload.cancel()  # the answer is over; an unfinished upload cannot continue
        if connection.reusable():
            idle = self._idle.setdefault(connection.pool_key, collections.deque())
            if len(idle) < MAX_IDLE_PER_WORKER:
                connection.idle_since = time.monotonic()
                idle.append(connection)
                return
        if connection.transport is not None:
            connection.transport.close()

    async def request(
        self,
        *,
        base_url: str,
        method: str,
        target: str,
        headers: Headers,
        body: bytes | AsyncIterator[bytes],
    ) -> UpstreamResponse:
        key = self._address(base_url)
        connection = self._take_idle(key)
        reused = connection is not None
        if connection is None:
            connection = await self._connect(key)
        try:
            return await self._exchange(connection, method=method, target=target, headers=headers, body=body)
        except ConnectionLost as exc:
            # A keep-alive connection the worker closed while idle: try once more on a fresh one.
            if not (reused and not exc.started and isinstance(body, bytes)):
                raise
        connection = await self._connect(key)
        return await self._exchange(connection, method=method, target=target, headers=headers, body=body)

    async def _exchange(
        self,
        connection: _Connection,
        *,
        method: str,
        target: str,
        headers: Headers,
        body: bytes | AsyncIterator[bytes],
    ) -> UpstreamResponse:
        connection.begin(head_only=method == "HEAD")
        transport = connection.transport
        assert transport is not None
        lines = [f"{method} {target} HTTP/1.1\r\n".encode(), b"host: ", connection.host_header, b"\r\n"]
        for name, value in headers:
            lines += [name, b": ", value, b"\r\n"]
        try:
            if isinstance(body, bytes):
                if body or method in ("POST", "PUT", "PATCH"):
                    lines += [b"content-length: ", str(len(body)).encode(), b"\r\n"]
                lines += [b"\r\n", body]
                transport.write(b"".join(lines))
            else:
                lines.append(b"transfer-encoding: chunked\r\n\r\n")
                transport.write(b"".join(lines))
                # Full duplex: the worker may answer (and stream) while the client still uploads,
                # as streaming input over one chunked POST does. The upload runs beside the answer.
                connection.upload = asyncio.ensure_future(_upload(connection, body))
                connection.upload.add_done_callback(connection.upload_done)
            timer = asyncio.get_running_loop().call_later(self.read_timeout, connection.time_out)
            try:
                await connection.headers_done
            finally:
                timer.cancel()
        except BaseException:
            transport.close()  # the body stream failed or we were cancelled: this connection is spent
            raise
        return UpstreamResponse(self, connection, read_timeout=self.read_timeout)

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                if connection.transport is not None:
                    connection.transport.close()
        self._idle.clear()
