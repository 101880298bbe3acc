"""A cap on the size of a request's head (request line and headers), enforced while it is parsed.

httptools, uvicorn's default parser, sets no limit of its own: a client could send a megabyte
header and the router would buffer it, hand it to the app, forward it and log it. The router's
HTTP protocol is uvicorn's httptools protocol with a byte budget for the head: the URL and every
header count as they are parsed, and bytes of a head that has not ended yet count as they
arrive, so a head that never ends is refused without being buffered whole. A head over the
budget is answered 431 with the router's OpenAI-style error JSON and the connection is closed.

`RouterApp` checks the same budget again on each request's headers (a server without this
protocol, or a test calling the app directly, gets the same answer).
"""

from __future__ import annotations

import asyncio
from typing import Any

from omni_runtime.router.errors import RouterError

DEFAULT_MAX_HEADER_BYTES = 64 * 1024  # request line plus all headers, as sent
HEAD_END = b"\r\n\r\n"
# After a 431 the rest of the head is read and dropped for this long before the connection
# closes: closing with unread bytes would reset it, and the client could lose the answer.
LINGER_S = 2.0


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing a head over the budget."""


def head_limited_protocol(max_header_bytes: int) -> type:
    """uvicorn's httptools protocol class with a `max_header_bytes` budget for each request head."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    error = RouterError.headers_too_large(limit=max_header_bytes)
    body = error.body()
    response = b"".join(
        [
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
            *(name + b": " + value + b"\r\n" for name, value in error.headers()),
            b"connection: close\r\n\r\n",
            body,
        ]
    )

    class HeadLimitedProtocol(HttpToolsProtocol):  # type: ignore[misc]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._head_open = True  # between messages or inside a head: its bytes count
            self._head_pending = 0  # bytes of a head that has not ended yet, as received
            self._head_tail = b""  # the last bytes received, for a head end split across reads
            self._head_parsed = 0  # bytes of this head the parser has handed over
            self._head_refused = False

        # -- parser callbacks: exact sizes ---------------------------------------------------
        def _count(self, size: int) -> None:
            self._head_parsed += size
            if self._head_parsed > max_header_bytes:
                self._head_refused = True
                raise _HeadTooLarge

        def on_message_begin(self) -> None:
            self._head_parsed = 0
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._head_open, self._head_pending = False, 0
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._head_open, self._head_pending, self._head_tail = True, 0, b""
            super().on_message_complete()

        # -- the bytes as they arrive: a head that never ends is not buffered whole ------------
        def data_received(self, data: bytes) -> None:
            if self._head_open and not self._head_refused:
                seen = self._head_tail + data
                if HEAD_END not in seen:
                    self._head_pending += len(data)
                    if self._head_pending > max_header_bytes:
                        self._refuse()
                        return
                self._head_tail = seen[-3:]
            if self._head_refused:
                return
            super().data_received(data)

        def send_400_response(self, msg: str) -> None:
            if self._head_refused:  # the parser stopped on our callback's exception
                self._refuse()
                return
            super().send_400_response(msg)

        def _refuse(self) -> None:
            self._head_refused = True
            self.logger.info("request head over %d bytes refused with 431", max_header_bytes)
            transport = self.transport
            if not (self.cycle is None or self.cycle.response_complete) or not transport.can_write_eof():
                transport.close()  # mid-response of a pipelined request: just end the connection
                return
            transport.write(response)
            transport.write_eof()  # the answer is complete; what the client still sends is dropped
            asyncio.get_running_loop().call_later(LINGER_S, transport.close)

    return HeadLimitedProtocol
