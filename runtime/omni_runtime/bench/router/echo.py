"""The router benchmark's echo upstream: a worker with no model time, the worst case for a proxy.

    python -m omni_runtime.bench.router.echo --port N [--delay-ms D] [--concurrency K]

Raw ASGI on uvicorn: every POST gets a small chat-completion JSON (after --delay-ms, as a worker
waiting on its accelerator would, without using this CPU; with --concurrency K at most K at a
time, first come first served, the shape of a saturated worker), /ready answers 200, and a
WebSocket on any path echoes each message back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

ANSWER = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    }
).encode()
_DELAY_S = 0.0  # set from --delay-ms
_SLOTS: asyncio.Semaphore | None = None  # set from --concurrency (asyncio's semaphore is FIFO)


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
        if _SLOTS is not None:
            async with _SLOTS:
                await asyncio.sleep(_DELAY_S)
        elif _DELAY_S:
            await asyncio.sleep(_DELAY_S)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def serve_upstream(port: int, delay_ms: float, concurrency: int = 0) -> None:
    import uvicorn

    global _DELAY_S, _SLOTS
    _DELAY_S = delay_ms / 1000
    _SLOTS = asyncio.Semaphore(concurrency) if concurrency > 0 else None
    uvicorn.run(upstream_app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m omni_runtime.bench.router.echo")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--concurrency", type=int, default=0)
    args = parser.parse_args(argv)
    serve_upstream(args.port, args.delay_ms, args.concurrency)
    return 0


if __name__ == "__main__":
    sys.exit(main())
