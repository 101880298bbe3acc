"""The stage link: a small binary transport between stage processes.

A stage that runs in its own process (`omni stage`) is reached through this link. It carries a
JSON payload plus named tensors per frame; tensor bytes go on the wire straight from the tensor's
memory (never through JSON) and come back as numpy arrays or CPU torch tensors, whichever was
sent. GPU tensors are moved to the CPU at the sending edge.

Wire format, one frame::

    header  28 bytes, little-endian: magic b"OMNL", version u8, frame type u8, flags u16,
            request id u64, metadata length u32, data length u64
    meta    UTF-8 JSON: {"method"?, "payload"?, "tensors": [{name, kind, dtype, shape, offset, nbytes}], ...}
    data    the tensors' raw bytes, back to back

One connection multiplexes many requests. A request gets zero or more REPLY frames, then END or
ERROR; the client sends CANCEL when it stops listening early and the server cancels the handler.

Server::

    async def encode(payload, tensors):            # an async generator: stream many replies
        yield {"n": 1}, {"features": tensors["audio"] * 2}

    server = StageLinkServer({"audio_encoder.encode": encode})
    address = await server.start("127.0.0.1", 0)   # "127.0.0.1:PORT"; `server.ready = True` when warm

Client::

    client = StageLinkClient(address)
    async with contextlib.aclosing(client.call("audio_encoder.encode", {}, {"audio": x})) as replies:
        async for payload, tensors in replies:
            ...
    await client.health()   # {"alive": True, "ready": ..., "methods": [...]}, built into every server
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import logging
import math
import struct
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

MAGIC = b"OMNL"
VERSION = 1
HEADER = struct.Struct("<4sBBHQIQ")
DEFAULT_MAX_FRAME_BYTES = 2 << 30  # tensors of one frame; hidden states and features stay far below
DEFAULT_MAX_META_BYTES = 16 << 20
HEALTH_METHOD = "health"
_READ_CHUNK = 4 << 20  # also the stream buffer size: fewer, larger socket reads for big tensors

Tensors = dict[str, Any]
Reply = tuple[dict[str, Any], Tensors]
Handler = Callable[[dict[str, Any], Tensors], Any]


class FrameType(IntEnum):
    REQUEST = 1
    REPLY = 2
    END = 3
    ERROR = 4
    CANCEL = 5


class LinkError(Exception):
    """Base of every stage-link failure."""


class LinkConnectionError(LinkError):
    """The connection could not be made, or was lost while a call was in flight."""


class LinkProtocolError(LinkError):
    """The peer sent bytes that are not a valid frame."""


class LinkFrameTooLarge(LinkError):
    """A frame is over the configured size limit (max_frame_bytes / max_meta_bytes)."""


class LinkRemoteError(LinkError):
    """The remote handler failed; ``remote_type`` names its exception class."""

    def __init__(self, message: str, *, remote_type: str = "Error", method: str = "") -> None:
        super().__init__(f"stage link method {method!r} failed: {remote_type}: {message}")
        self.message, self.remote_type, self.method = message, remote_type, method


class _BadFrame(LinkProtocolError):
    """A well-framed frame with unusable contents: the stream is still in sync."""

    def __init__(self, message: str, request_id: int) -> None:
        super().__init__(message)
        self.request_id = request_id


@dataclass
class Frame:
    type: FrameType
    request_id: int
    meta: dict[str, Any]
    tensors: Tensors


# --- tensors <-> bytes -------------------------------------------------------------------------


def _tensor_bytes(name: str, value: Any) -> tuple[dict[str, Any], memoryview]:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        cpu = value.detach().to("cpu").contiguous()
        flat = cpu.reshape(-1)
        raw = flat.view(torch.uint8)  # any dtype (bfloat16, bool, float8) as plain bytes
        spec = {"kind": "torch", "dtype": str(cpu.dtype).removeprefix("torch."), "shape": list(cpu.shape)}
        return spec, raw.numpy().data.cast("B")
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError(f"tensor {name!r}: numpy arrays of Python objects cannot cross a stage link")
        arr = value if value.flags.c_contiguous else value.copy(order="C")  # keeps 0-d arrays 0-d
        spec = {"kind": "numpy", "dtype": arr.dtype.str, "shape": list(arr.shape)}
        return spec, arr.reshape(-1).data.cast("B")
    raise TypeError(f"tensor {name!r}: expected a numpy array or torch tensor, got {type(value).__name__}")


def encode_tensors(tensors: Mapping[str, Any] | None) -> tuple[list[dict[str, Any]], list[memoryview]]:
    """Describe ``tensors`` for the metadata and return views of their bytes (no copies)."""
    specs, views, offset = [], [], 0
    for name, value in (tensors or {}).items():
        spec, view = _tensor_bytes(str(name), value)
        specs.append({"name": str(name), **spec, "offset": offset, "nbytes": view.nbytes})
        views.append(view)
        offset += view.nbytes
    return specs, views


def _decode_one(spec: dict[str, Any], data: bytearray) -> Any:
    shape, offset, nbytes = tuple(int(d) for d in spec["shape"]), int(spec["offset"]), int(spec["nbytes"])
    if offset < 0 or nbytes < 0 or offset + nbytes > len(data) or any(d < 0 for d in shape):
        raise ValueError("tensor bytes out of range")
    if spec["kind"] == "numpy":
        dtype = np.dtype(spec["dtype"])
        if dtype.hasobject or math.prod(shape) * dtype.itemsize != nbytes:
            raise ValueError(f"numpy {dtype} {list(shape)} does not fit {nbytes} bytes")
        return np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape)
    if spec["kind"] == "torch":
        import torch

        dtype = getattr(torch, str(spec["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown torch dtype {spec['dtype']!r}")
        itemsize = torch.empty((), dtype=dtype).element_size()
        if math.prod(shape) * itemsize != nbytes:
            raise ValueError(f"torch {dtype} {list(shape)} does not fit {nbytes} bytes")
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        raw = torch.frombuffer(data, dtype=torch.uint8, count=nbytes, offset=offset)
        return raw.view(dtype).reshape(shape)
    raise ValueError(f"unknown tensor kind {spec['kind']!r}")


def decode_tensors(specs: list[dict[str, Any]], data: bytearray) -> Tensors:
    """Rebuild tensors from their specs; they share ``data``'s memory (writable, no copy)."""
    return {str(spec["name"]): _decode_one(spec, data) for spec in specs}


# --- frames on a stream ------------------------------------------------------------------------


def write_frame(
    writer: asyncio.StreamWriter,
    frame_type: FrameType,
    request_id: int,
    meta: dict[str, Any] | None = None,
    tensors: Mapping[str, Any] | None = None,
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    max_meta_bytes: int = DEFAULT_MAX_META_BYTES,
) -> None:
    """Queue one whole frame on ``writer`` without awaiting, so concurrent frames never interleave."""
    specs, views = encode_tensors(tensors)
    meta_bytes = json.dumps({**(meta or {}), "tensors": specs}, separators=(",", ":")).encode()
    data_len = sum(v.nbytes for v in views)
    if data_len > max_frame_bytes:
        raise LinkFrameTooLarge(
            f"frame tensors are {data_len} bytes, over the stage link limit of {max_frame_bytes} "
            "bytes (max_frame_bytes): send smaller pieces or raise the limit on both ends"
        )
    if len(meta_bytes) > max_meta_bytes:
        raise LinkFrameTooLarge(
            f"frame metadata is {len(meta_bytes)} bytes, over the limit of {max_meta_bytes} bytes "
            "(max_meta_bytes): move large values into tensors"
        )
    header = HEADER.pack(MAGIC, VERSION, int(frame_type), 0, request_id, len(meta_bytes), data_len)
    writer.write(header + meta_bytes)
    for view in views:
        if view.nbytes:
            writer.write(view)


async def read_frame(
    reader: asyncio.StreamReader,
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    max_meta_bytes: int = DEFAULT_MAX_META_BYTES,
) -> Frame | None:
    """Read one frame; None at a clean end of stream between frames."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise LinkConnectionError("stream ended inside a frame header") from exc
    magic, version, ftype, _flags, request_id, meta_len, data_len = HEADER.unpack(header)
    if magic != MAGIC:
        raise LinkProtocolError(f"bad frame magic {magic!r}: the peer does not speak the stage link")
    if version != VERSION:
        raise LinkProtocolError(f"stage link version {version} from the peer; this side speaks {VERSION}")
    if meta_len > max_meta_bytes or data_len > max_frame_bytes:
        raise LinkFrameTooLarge(
            f"incoming frame has {meta_len} metadata and {data_len} tensor bytes, over the limits "
            f"{max_meta_bytes} (max_meta_bytes) and {max_frame_bytes} (max_frame_bytes)"
        )
    meta_raw = await reader.readexactly(meta_len)
    data = bytearray(data_len)
    view, filled = memoryview(data), 0
    while filled < data_len:  # chunked, so the reader's own buffer never holds a whole large frame
        chunk = await reader.read(min(_READ_CHUNK, data_len - filled))
        if not chunk:
            raise LinkConnectionError("stream ended inside a frame body")
        view[filled : filled + len(chunk)] = chunk
        filled += len(chunk)
    try:
        kind = FrameType(ftype)
        meta = json.loads(meta_raw)
        if not isinstance(meta, dict):
            raise ValueError("metadata is not a JSON object")
        tensors = decode_tensors(meta.pop("tensors", []), data)
    except (ValueError, KeyError, TypeError) as exc:
        raise _BadFrame(f"malformed frame: {exc}", request_id) from exc
    return Frame(kind, request_id, meta, tensors)


def parse_address(address: str | tuple[str, int]) -> tuple[str, int] | str:
    """``"host:port"``, ``"[::1]:port"``, ``(host, port)`` or ``"unix:/path"`` (returned as the path)."""
    if isinstance(address, tuple):
        return address[0], int(address[1])
    if address.startswith("unix:"):
        return address.removeprefix("unix:")
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"stage link address {address!r}: expected HOST:PORT or unix:/PATH")
    return host.strip("[]") or "127.0.0.1", int(port)


# --- server ------------------------------------------------------------------------------------


class StageLinkServer:
    """Serves ``handlers`` (method name -> handler) to stage-link clients.

    A handler is ``async def h(payload, tensors)`` that either yields ``(payload, tensors)``
    replies (an async generator: streaming) or returns one ``(payload, tensors)`` tuple. An
    exception becomes an ERROR frame carrying its message; the connection and server stay up.
    ``ready`` (a bool or a callable returning one) is reported by the built-in ``health`` method.
    """

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        *,
        ready: bool | Callable[[], bool] = True,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_meta_bytes: int = DEFAULT_MAX_META_BYTES,
    ) -> None:
        if HEALTH_METHOD in handlers:
            raise ValueError(f"handler name {HEALTH_METHOD!r} is built in; choose another method name")
        self.handlers = dict(handlers)
        self.ready = ready
        self.limits = {"max_frame_bytes": max_frame_bytes, "max_meta_bytes": max_meta_bytes}
        self.address = ""
        self._server: asyncio.AbstractServer | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on TCP; returns ``"host:port"`` (port 0 picks a free one)."""
        self._server = await asyncio.start_server(self._serve_connection, host, port, limit=_READ_CHUNK)
        bound = self._server.sockets[0].getsockname()
        self.address = f"[{bound[0]}]:{bound[1]}" if ":" in bound[0] else f"{bound[0]}:{bound[1]}"
        return self.address

    async def start_unix(self, path: str) -> str:
        self._server = await asyncio.start_unix_server(self._serve_connection, path, limit=_READ_CHUNK)
        self.address = f"unix:{path}"
        return self.address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        # Closing the streams ends each connection's read loop, which cancels its calls; cancelling
        # the connection tasks themselves would make asyncio log their CancelledError.
        for writer in list(self._connections.values()):
            writer.close()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> StageLinkServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def is_ready(self) -> bool:
        return bool(self.ready() if callable(self.ready) else self.ready)

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        assert me is not None
        self._connections[me] = writer
        calls: dict[int, asyncio.Task[None]] = {}
        try:
            while True:
                try:
                    frame = await read_frame(reader, **self.limits)
                except _BadFrame as exc:  # stream still in sync: answer and keep serving
                    self._send(writer, FrameType.ERROR, exc.request_id, _error_meta(exc))
                    continue
                except (LinkProtocolError, LinkFrameTooLarge) as exc:
                    log.warning("stage link: closing a connection: %s", exc)
                    self._send(writer, FrameType.ERROR, 0, _error_meta(exc))
                    break
                if frame is None:
                    break
                if frame.type is FrameType.REQUEST and frame.request_id not in calls:
                    calls[frame.request_id] = asyncio.create_task(self._run_call(writer, frame, calls))
                elif frame.type is FrameType.CANCEL:
                    if (running := calls.get(frame.request_id)) is not None:
                        running.cancel()
                else:
                    error = LinkProtocolError(
                        f"unexpected {frame.type.name} frame for request {frame.request_id}"
                    )
                    self._send(writer, FrameType.ERROR, frame.request_id, _error_meta(error))
        except (LinkConnectionError, ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away or the server is closing; its calls are cancelled below
        finally:
            for task in calls.values():
                task.cancel()
            await asyncio.gather(*calls.values(), return_exceptions=True)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._connections.pop(me, None)

    def _send(
        self, writer: asyncio.StreamWriter, ftype: FrameType, rid: int, meta: dict, tensors=None
    ) -> None:
        if not writer.is_closing():
            write_frame(writer, ftype, rid, meta, tensors, **self.limits)

    async def _run_call(
        self, writer: asyncio.StreamWriter, frame: Frame, calls: dict[int, asyncio.Task[None]]
    ) -> None:
        rid, method = frame.request_id, str(frame.meta.get("method", ""))
        try:
            async for payload, tensors in self._replies(
                method, frame.meta.get("payload") or {}, frame.tensors
            ):
                if not isinstance(payload, dict):
                    raise TypeError(
                        f"handler {method!r} replied with {type(payload).__name__}, not a dict payload"
                    )
                self._send(writer, FrameType.REPLY, rid, {"payload": payload}, tensors)
                await writer.drain()  # back-pressure: a slow client slows its own handler only
            self._send(writer, FrameType.END, rid, {})
            await writer.drain()
        except asyncio.CancelledError:
            raise
        except (ConnectionError, LinkConnectionError):
            pass
        except Exception as exc:
            log.info("stage link: method %r failed: %s", method, exc, exc_info=not isinstance(exc, LinkError))
            with contextlib.suppress(Exception):
                self._send(writer, FrameType.ERROR, rid, _error_meta(exc))
                await writer.drain()
        finally:
            calls.pop(rid, None)

    async def _replies(self, method: str, payload: dict[str, Any], tensors: Tensors) -> AsyncIterator[Reply]:
        if method == HEALTH_METHOD:
            yield {"alive": True, "ready": self.is_ready(), "methods": sorted(self.handlers)}, {}
            return
        handler = self.handlers.get(method)
        if handler is None:
            raise LookupError(f"unknown method {method!r}; this stage serves {sorted(self.handlers)}")
        result = handler(payload, tensors)
        if inspect.isawaitable(result):
            yield await result
            return
        async with contextlib.aclosing(result) as replies:
            async for reply in replies:
                yield reply


def _error_meta(exc: BaseException) -> dict[str, Any]:
    return {"message": str(exc), "type": type(exc).__name__}


# --- client ------------------------------------------------------------------------------------


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
                except _BadFrame as exc:  # still in sync: fail that call only
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
                        reader, writer = await asyncio.open_unix_connection(self.target, limit=_READ_CHUNK)
                    else:
                        reader, writer = await asyncio.open_connection(*self.target, limit=_READ_CHUNK)
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
    ) -> AsyncIterator[Reply]:
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
