"""Stage link calls: streaming, multiplexing, cancellation, errors, malformed input, reconnects."""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct

import numpy as np
import pytest

from omni_runtime.pipeline.link.client import StageLinkClient
from omni_runtime.pipeline.link.frames import (
    HEADER,
    MAGIC,
    VERSION,
    FrameType,
    LinkConnectionError,
    LinkRemoteError,
    read_frame,
)
from omni_runtime.pipeline.link.server import StageLinkServer


async def count(payload, tensors):
    for i in range(payload["n"]):
        yield {"i": i}, {"v": np.full(3, i, dtype=np.int32)}


async def fail_after_two(payload, tensors):
    yield {"i": 0}, {}
    yield {"i": 1}, {}
    raise ValueError("sample rate 7 Hz is not supported; send 16000 Hz audio")


@contextlib.asynccontextmanager
async def serving(handlers, **kwargs):
    async with StageLinkServer(handlers, **kwargs) as server:
        address = await server.start()
        async with StageLinkClient(address, connect_timeout=2.0) as client:
            yield server, client


async def test_streaming_replies_arrive_in_order_then_end() -> None:
    async with serving({"count": count}) as (_, client):
        replies = [(p["i"], t["v"].tolist()) async for p, t in client.call("count", {"n": 5})]
        assert replies == [(i, [i, i, i]) for i in range(5)]
        assert [r async for r in client.call("count", {"n": 0})] == []


async def test_concurrent_calls_share_one_connection() -> None:
    gate = asyncio.Event()

    async def waits(payload, tensors):  # finishes only if "opens" runs while it is in flight
        await asyncio.wait_for(gate.wait(), 5)
        return {"waited": True}, {}

    async def opens(payload, tensors):
        gate.set()
        return {"opened": True}, {}

    async def square(payload, tensors):
        await asyncio.sleep(0.001 * (payload["x"] % 5))
        return {"y": payload["x"] ** 2}, {"t": tensors["t"] * 2}

    async with serving({"waits": waits, "opens": opens, "square": square}) as (server, client):
        first = asyncio.create_task(client.call_once("waits"))
        await asyncio.sleep(0.05)
        assert (await client.call_once("opens"))[0] == {"opened": True}
        assert (await first)[0] == {"waited": True}
        calls = [client.call_once("square", {"x": x}, {"t": np.array([x])}) for x in range(40)]
        results = await asyncio.gather(*calls)
        assert [(p["y"], t["t"].item()) for p, t in results] == [(x * x, 2 * x) for x in range(40)]
        assert len(server._connections) == 1


async def test_closing_the_iterator_cancels_the_handler() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def endless(payload, tensors):
        try:
            started.set()
            i = 0
            while True:
                yield {"i": i}, {}
                i += 1
                await asyncio.sleep(0.01)
        finally:
            cancelled.set()

    async def hangs(payload, tensors):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return {}, {}

    async with serving({"endless": endless, "hangs": hangs}) as (_, client):
        async with contextlib.aclosing(client.call("endless")) as replies:
            async for payload, _ in replies:
                if payload["i"] == 2:
                    break
        await asyncio.wait_for(cancelled.wait(), 5)

        cancelled.clear()
        task = asyncio.create_task(client.call_once("hangs"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(cancelled.wait(), 5)
        assert (await client.health())["alive"] is True


async def test_handler_errors_reach_the_client_with_their_message() -> None:
    async with serving({"fail": fail_after_two, "count": count}) as (_, client):
        seen = []
        with pytest.raises(LinkRemoteError) as info:
            async for payload, _ in client.call("fail"):
                seen.append(payload["i"])
        assert seen == [0, 1]
        assert info.value.remote_type == "ValueError"
        assert info.value.message == "sample rate 7 Hz is not supported; send 16000 Hz audio"
        assert "'fail' failed: ValueError: sample rate 7 Hz" in str(info.value)
        with pytest.raises(
            LinkRemoteError, match=r"unknown method 'nope'; this stage serves \['count', 'fail'\]"
        ):
            await client.call_once("nope")
        assert [p["i"] async for p, _ in client.call("count", {"n": 2})] == [0, 1]  # connection still fine


async def test_bad_replies_are_errors_not_crashes() -> None:
    async def not_a_dict(payload, tensors):
        return ["x"], {}

    async def not_a_tensor(payload, tensors):
        return {}, {"t": [1, 2]}

    async with serving({"a": not_a_dict, "b": not_a_tensor}) as (_, client):
        with pytest.raises(LinkRemoteError, match="replied with list, not a dict payload"):
            await client.call_once("a")
        with pytest.raises(LinkRemoteError, match="tensor 't': expected a numpy array or torch tensor"):
            await client.call_once("b")


async def test_health_reports_readiness() -> None:
    state = {"ready": False}
    async with serving({"count": count}, ready=lambda: state["ready"]) as (_, client):
        assert await client.health() == {"alive": True, "ready": False, "methods": ["count"]}
        state["ready"] = True
        assert (await client.health())["ready"] is True
    with pytest.raises(ValueError, match="'health' is built in"):
        StageLinkServer({"health": count})


async def test_malformed_frames_do_not_crash_the_server() -> None:
    async with serving({"count": count}) as (server, client):
        host, port = server.address.rsplit(":", 1)
        # 1. Garbage: the server answers with an error frame and closes only that connection.
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 16)
        frame = await asyncio.wait_for(read_frame(reader), 5)
        assert (
            frame is not None and frame.type is FrameType.ERROR and "bad frame magic" in frame.meta["message"]
        )
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        # 2. A well-framed request with broken JSON: error for that request, the connection lives on.
        reader, writer = await asyncio.open_connection(host, int(port))
        meta = b"{not json"
        writer.write(HEADER.pack(MAGIC, VERSION, FrameType.REQUEST, 0, 7, len(meta), 0) + meta)
        frame = await asyncio.wait_for(read_frame(reader), 5)
        assert frame is not None and (frame.type, frame.request_id) == (FrameType.ERROR, 7)
        assert frame.meta["message"].startswith("malformed frame:")
        good = json.dumps({"method": "count", "payload": {"n": 1}, "tensors": []}).encode()
        writer.write(HEADER.pack(MAGIC, VERSION, FrameType.REQUEST, 0, 8, len(good), 0) + good)
        frame = await asyncio.wait_for(read_frame(reader), 5)
        assert frame is not None and (frame.type, frame.meta["payload"]) == (FrameType.REPLY, {"i": 0})
        # 3. Tensor specs that do not match the bytes, then a truncated frame and a hang-up.
        bad = json.dumps(
            {
                "method": "count",
                "tensors": [
                    {"name": "x", "kind": "numpy", "dtype": "<f4", "shape": [100], "offset": 0, "nbytes": 400}
                ],
            }
        ).encode()
        writer.write(HEADER.pack(MAGIC, VERSION, FrameType.REQUEST, 0, 9, len(bad), 4) + bad + b"\0" * 4)
        while (frame := await asyncio.wait_for(read_frame(reader), 5)).request_id != 9:
            pass
        assert frame.type is FrameType.ERROR and "out of range" in frame.meta["message"]
        writer.write(struct.pack("<4sBB", MAGIC, VERSION, 1))
        writer.close()
        # The real client never noticed any of this.
        assert [p["i"] async for p, _ in client.call("count", {"n": 3})] == [0, 1, 2]


async def test_lost_connection_fails_in_flight_calls_then_reconnects() -> None:
    async def slow(payload, tensors):
        await asyncio.sleep(3600)
        return {}, {}

    server = StageLinkServer({"slow": slow, "count": count})
    address = await server.start()
    port = int(address.rsplit(":", 1)[1])
    async with StageLinkClient(address, connect_timeout=5.0) as client:
        in_flight = asyncio.create_task(client.call_once("slow"))
        await asyncio.sleep(0.05)
        await server.close()
        with pytest.raises(LinkConnectionError, match=r"lost while call 'slow' \(request 1\) was in flight"):
            await in_flight
        async with StageLinkServer({"count": count}) as again:
            await again.start("127.0.0.1", port)
            assert [p["i"] async for p, _ in client.call("count", {"n": 2})] == [0, 1]


async def test_connect_failure_names_the_address() -> None:
    server = StageLinkServer({})
    address = await server.start()
    await server.close()  # a port nobody listens on any more
    async with StageLinkClient(address, connect_timeout=0.3) as client:
        with pytest.raises(LinkConnectionError, match=rf"cannot connect to stage link {address} within 0.3s"):
            await client.health()
