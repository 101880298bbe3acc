"""A small real worker for router tests: answers with its worker id over HTTP, SSE and WebSocket.

Run as its own process (`python upstream.py --port N --worker-id w0`) so a test can kill it like a
crashed worker. It is a legitimate upstream, not a stand-in for the router: the router under test
talks to it over real sockets exactly as it talks to `omni serve`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "runtime"))
from omni_runtime.contract.sessions import make_session_id


def build_app(worker_id: str):
    state = {"ready": True, "streams": 0}

    async def ready(request: Request) -> Response:
        return JSONResponse({"ready": state["ready"]}, status_code=200 if state["ready"] else 503)

    async def set_ready(request: Request) -> Response:
        state["ready"] = request.query_params.get("value", "1") == "1"
        return JSONResponse({"ready": state["ready"]})

    async def whoami(request: Request) -> Response:
        return JSONResponse(
            {
                "worker": worker_id,
                "path": request.url.path,
                "query": request.url.query,
                "session_header": request.headers.get("x-session-id"),
                "forwarded_for": request.headers.get("x-forwarded-for"),
            }
        )

    async def echo(request: Request) -> Response:
        body = await request.body()
        return JSONResponse({"worker": worker_id, "size": len(body), "body": body.decode(errors="replace")})

    async def sse(request: Request) -> Response:
        count = int(request.query_params.get("n", "5"))
        delay = float(request.query_params.get("delay", "0.2"))

        async def events():
            state["streams"] += 1  # open streams, so a test can see the router let go of one
            try:
                for index in range(count):
                    yield f"data: {json.dumps({'worker': worker_id, 'index': index})}\n\n"
                    await asyncio.sleep(delay)
                yield "data: [DONE]\n\n"
            finally:
                state["streams"] -= 1

        return StreamingResponse(events(), media_type="text/event-stream")

    async def duplex(scope, receive, send) -> None:
        """Answers each uploaded chunk as it arrives: streaming input over one chunked POST.

        Raw ASGI on purpose: Starlette's StreamingResponse listens for a disconnect on `receive`
        while streaming, which would swallow the very body chunks this endpoint answers.
        """
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            if message.get("body"):
                event = {"worker": worker_id, "got": message["body"].decode()}
                await send(
                    {
                        "type": "http.response.body",
                        "body": f"data: {json.dumps(event)}\n\n".encode(),
                        "more_body": True,
                    }
                )
            if not message.get("more_body", False):
                break
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    async def stats(request: Request) -> Response:
        return JSONResponse({"worker": worker_id, "streams": state["streams"]})

    async def new_session(request: Request) -> Response:
        return JSONResponse({"session_id": make_session_id(worker_id=worker_id), "worker": worker_id})

    async def session_chunk(request: Request) -> Response:
        return JSONResponse({"worker": worker_id, "session_id": request.path_params["session_id"]})

    async def ws(websocket: WebSocket) -> None:
        offered = websocket.scope.get("subprotocols") or []
        await websocket.accept(subprotocol=offered[0] if offered else None)
        await websocket.send_json({"worker": worker_id, "subprotocol": offered[0] if offered else None})
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                if message.get("bytes") is not None:
                    await websocket.send_bytes(message["bytes"][::-1])
                    continue
                text = message["text"]
                if text.startswith("close:"):  # close:CODE:REASON
                    _, code, reason = text.split(":", 2)
                    await websocket.close(int(code), reason)
                    return
                await websocket.send_text(f"{worker_id}:{text}")
        except WebSocketDisconnect:
            return

    async def refuse(websocket: WebSocket) -> None:
        await websocket.close(1008)

    routes = Starlette(
        routes=[
            Route("/ready", ready),
            Route("/health", lambda request: JSONResponse({"status": "ok"})),
            Route("/control/ready", set_ready, methods=["POST"]),
            Route("/whoami", whoami, methods=["GET", "POST"]),
            Route("/v1/whoami", whoami, methods=["GET", "POST"]),
            Route("/echo", echo, methods=["POST"]),
            Route("/sse", sse),
            Route("/stats", stats),
            Route("/v1/streaming_input/sessions", new_session, methods=["POST"]),
            Route("/v1/streaming_input/sessions/{session_id}/chunks", session_chunk, methods=["POST"]),
            WebSocketRoute("/ws", ws),
            WebSocketRoute("/refuse", refuse),
        ]
    )

    async def app(scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] == "/duplex":
            await duplex(scope, receive, send)
        else:
            await routes(scope, receive, send)

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--worker-id", required=True)
    args = parser.parse_args()
    uvicorn.run(build_app(args.worker_id), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
