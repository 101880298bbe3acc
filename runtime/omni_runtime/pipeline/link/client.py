"""The client side of the stage link: one connection multiplexes many calls."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from omni_runtime.pipeline.link.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_MAX_META_BYTES,
    HEALTH_METHOD,
    READ_CHUNK,
    BadFrame,
    Frame,
    FrameType,
    LinkConnectionError,
    LinkError,
    LinkProtocolError,
    LinkRemoteError,
    Reply,
    parse_address,
    read_frame,
    write_frame,
)

log = logging.getLogger(__name__)


class _Connection:
    """One open stream; routes incoming frames to the queue of their request id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client: StageLinkClient):
        self.reader, self.writer, self.client = reader, writer, client
        self.pending: dict[int, tuple[str, asyncio.Queue[Frame | BaseException]]] = {}
        self.lost: LinkConnectionError | None = None
        self.task = asyncio.create_task(self._read_loop())

    async def _read_loop(self) -> None:
        reason = "the server closed the connection"
        try:
            while True:
                try:
                    frame = await read_frame(self.reader, **self.client.limits)
                except BadFrame as exc:  # still in sync: fail that call only
                    if exc.request_id in self.pending:
                        self.pending[exc.request_id][1].put_nowait(LinkProtocolError(str(exc)))
                    continue
                if frame is None:
                    break
                if frame.request_id in self.pending:
                    self.pending[frame.request_id][1].put_nowait(frame)
                elif frame.type is FrameType.ERROR and frame.request_id == 0:
                    reason = f"the server rejected the stream: {frame.meta.get('message')}"
        except (LinkError, ConnectionError, asyncio.IncompleteReadError) as exc:
            reason = str(exc) or type(exc).__name__
        except asyncio.CancelledError:
            reason = "the client closed the connection"
        self.lost = LinkConnectionError(f"stage link {self.client.address}: {reason}")
        for rid, (method, queue) in self.pending.items():
            queue.put_nowait(
                LinkConnectionError(
                    f"stage link {self.client.address} lost while call {method!r} (request {rid}) "
                    f"was in flight: {reason}"
                )
            )
        self.writer.close()


class StageLinkClient:
    """Calls methods of a :class:`StageLinkServer` over one multiplexed connection.

    The connection opens on first use and is re-opened on the next call after it is lost (calls
    in flight at that moment raise :class:`LinkConnectionError`). Connecting retries until
    ``connect_timeout`` seconds pass, so a client may start before its stage server.
    """

    def __init__(
        self,
        address: str | tuple[str, int],
        *,
        connect_timeout: float = 10.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_meta_bytes: int = DEFAULT_MAX_META_BYTES,
    ) -> None:
        self.target = parse_address(address)
        self.address = address if isinstance(address, str) else f"{address[0]}:{address[1]}"
        self.connect_timeout = connect_timeout
        self.limits = {"max_frame_bytes": max_frame_bytes, "max_meta_bytes": max_meta_bytes}
        self._conn: _Connection | None = None
        self._connecting = asyncio.Lock()
        self._ids = itertools.count(1)

    async def _connection(self) -> _Connection:
        async with self._connecting:
            if self._conn is not None and self._conn.lost is None:
                return self._conn
            loop = asyncio.get_running_loop()
            deadline, delay = loop.time() + self.connect_timeout, 0.05
            while True:
                try:
                    if isinstance(self.target, str):
                        reader, writer = await asyncio.open_unix_connection(self.target, limit=READ_CHUNK)
                    else:
                        reader, writer = await asyncio.open_connection(*self.target, limit=READ_CHUNK)
                    break
                except OSError as exc:
                    if loop.time() + delay > deadline:
                        raise LinkConnectionError(
                            f"cannot connect to stage link {self.address} within {self.connect_timeout:g}s: "
                            f"{exc}; is `omni stage` running there?"
                        ) from exc
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 1.0)
            self._conn = _Connection(reader, writer, self)
            return self._conn

    async def call(
        self, method: str, payload: dict[str, Any] | None = None, tensors: Mapping[str, Any] | None = None
    ) -> AsyncGenerator[Reply, None]:
        """Stream the replies of ``method``. Closing the iterator early cancels the remote handler.

        Wrap in ``contextlib.aclosing`` (or exhaust it) so an early exit cancels at once.
        """
        conn = await self._connection()
        rid = next(self._ids)
        queue: asyncio.Queue[Frame | BaseException] = asyncio.Queue()
        meta = {"method": method, "payload": payload or {}}
        write_frame(
            conn.writer, FrameType.REQUEST, rid, meta, tensors, **self.limits
        )  # raises before registering
        conn.pending[rid] = (method, queue)
        done = False
        try:
            await conn.writer.drain()
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    done = True
                    raise item
                if item.type is FrameType.REPLY:
                    yield item.meta.get("payload") or {}, item.tensors
                elif item.type is FrameType.END:
                    done = True
                    return
                elif item.type is FrameType.ERROR:
                    done = True
                    message, remote_type = str(item.meta.get("message")), str(item.meta.get("type", "Error"))
                    raise LinkRemoteError(message, remote_type=remote_type, method=method)
        except (ConnectionError, OSError) as exc:
            done = True
            raise LinkConnectionError(f"stage link {self.address}: sending {method!r} failed: {exc}") from exc
        finally:
            conn.pending.pop(rid, None)
            if not done and conn.lost is None and not conn.writer.is_closing():
                with contextlib.suppress(Exception):
                    write_frame(conn.writer, FrameType.CANCEL, rid, {})

    async def call_once(
        self, method: str, payload: dict[str, Any] | None = None, tensors: Mapping[str, Any] | None = None
    ) -> Reply:
        """Call a method that replies once; returns that reply."""
        replies = [reply async for reply in self.call(method, payload, tensors)]
        if len(replies) != 1:
            raise LinkProtocolError(f"method {method!r} sent {len(replies)} replies, expected exactly one")
        return replies[0]

    async def health(self, *, timeout: float = 5.0) -> dict[str, Any]:
        """The server's built-in health: {"alive": True, "ready": bool, "methods": [...]}."""
        payload, _ = await asyncio.wait_for(self.call_once(HEALTH_METHOD), timeout)
        return payload

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.task.cancel()
            await asyncio.gather(conn.task, return_exceptions=True)
            with contextlib.suppress(Exception):
                await conn.writer.wait_closed()

    async def __aenter__(self) -> StageLinkClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
