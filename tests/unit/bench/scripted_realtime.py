"""A real websocket server that plays a realtime worker's part for the probes' tests: it answers
``session.update`` and, at each ``response.create``, sends the given events."""

from __future__ import annotations

import json
from typing import Any


async def scripted_server(events: list[dict[str, Any]]) -> Any:
    import websockets

    async def handler(ws: Any) -> None:
        await ws.send(json.dumps({"type": "session.created"}))
        async for message in ws:
            kind = json.loads(message)["type"]
            if kind == "session.update":
                await ws.send(json.dumps({"type": "session.updated"}))
            elif kind == "response.create":
                for event in events:
                    await ws.send(json.dumps(event))

    return await websockets.serve(handler, "127.0.0.1", 0)
