"""The server side of the stage link: serves handlers (method -> handler) to clients."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from omni_runtime.pipeline.link.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_MAX_META_BYTES,
    HEALTH_METHOD,
    READ_CHUNK,
    BadFrame,
    Frame,
    FrameType,
    Handler,
    LinkConnectionError,
    LinkError,
    LinkFrameTooLarge,
    LinkProtocolError,
    Reply,
    Tensors,
    read_frame,
    write_frame,
)

log = logging.getLogger(__name__)


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
        self._server = await asyncio.start_server(self._serve_connection, host, port, limit=READ_CHUNK)
        bound = self._server.sockets[0].getsockname()
        self.address = f"[{bound[0]}]:{bound[1]}" if ":" in bound[0] else f"{bound[0]}:{bound[1]}"
        return self.address

    async def start_unix(self, path: str) -> str:
        self._server = await asyncio.start_unix_server(self._serve_connection, path, limit=READ_CHUNK)
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
                except BadFrame as exc:  # stream still in sync: answer and keep serving
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
